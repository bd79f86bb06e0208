"""`rollflow serve`: serve the run flow and the replay flow as Prefect deployments (runs from the UI's Run
form, schedules, the API).

Each served flow run executes in its own subprocess, which starts its own Ray actors (or joins
`--ray-address`), so served runs are independent. A run of `rollflow-run/<name>` given only some fields of
`cfg` gets the served config for the rest (`deployments/params.py`). Schedules need a real server
(`rollflow server` + PREFECT_API_URL); Prefect's ephemeral server cannot run them.
"""

from __future__ import annotations

from typing import Any

from prefect import serve

from config import RunConfig
from flows.replay import replay_flow
from flows.run import run_flow, run_tags

REPLAY_DEPLOYMENT = "rollflow"  # served as replay/rollflow, as prefect.yaml declares it


def deployments(cfg: RunConfig, *, cron: str | None = None, interval: int | None = None) -> list[Any]:
    """The two deployments `rollflow serve` serves: `rollflow-run/<name>`, whose served `cfg` is the fields
    `cfg` was given (the rest are RunConfig's defaults), and `replay/rollflow` (run dir, rollout id, stage)."""
    run = run_flow.to_deployment(
        name=cfg.name,
        parameters={"cfg": cfg.model_dump(mode="json", exclude_unset=True)},
        cron=cron,
        interval=interval,
        description=f"rollflow run '{cfg.name}' (recipe {cfg.recipe})",
        tags=run_tags(cfg),
    )
    replay = replay_flow.to_deployment(
        name=REPLAY_DEPLOYMENT,
        tags=["rollflow"],
        description="Re-run one stage of a past rollout from its recorded inputs and report the first difference "
        "(rollflow replay).",
    )
    return [run, replay]


def serve_run(
    cfg: RunConfig, *, cron: str | None = None, interval: int | None = None, limit: int = 1
) -> None:
    """Block serving `deployments(cfg, ...)`, at most `limit` flow runs at a time."""
    serve(*deployments(cfg, cron=cron, interval=interval), limit=limit)  # type: ignore[arg-type]
