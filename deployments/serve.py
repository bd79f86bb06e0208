"""`rollflow serve`: serve the run flow as a Prefect deployment (runs from the UI, schedules, API).

Each served flow run executes in its own subprocess, which starts its own Ray actors (or joins
`--ray-address`), so served runs are independent. Schedules need a real server
(`rollflow server` + PREFECT_API_URL); Prefect's ephemeral server cannot run them.
"""

from __future__ import annotations

from prefect import serve

from flows.config import RunConfig
from flows.run import run_flow


def serve_run(cfg: RunConfig, *, cron: str | None = None, interval: int | None = None, limit: int = 1) -> None:
    """Block serving deployment `rollflow-run/<name>` whose default parameters are `cfg`."""
    deployment = run_flow.to_deployment(
        name=cfg.name, parameters={"cfg": cfg.model_dump(mode="json")}, cron=cron, interval=interval,
        description=f"rollflow run '{cfg.name}' (recipe {cfg.recipe})", tags=["rollflow"])
    serve(deployment, limit=limit)  # type: ignore[arg-type]  # to_deployment is sync here
