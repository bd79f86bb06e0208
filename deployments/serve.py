"""`rollflow serve`: serve the run flow and the replay flow as Prefect deployments (runs from the UI's Run
form, schedules, the API).

Each served flow run executes in its own subprocess, which starts its own Ray actors (or joins
`--ray-address`), so served runs are independent. A run of `rollflow-run/<name>-served` given only some fields of
`cfg` gets the served config for the rest (`deployments/params.py`). Schedules need a real server
(`rollflow server` + PREFECT_API_URL); Prefect's ephemeral server cannot run them.

The served deployments' names end in `served`; prefect.yaml's, which a work pool's workers run, end in
`worker`. One name on one server is one deployment. Serving a work pool's deployment would take it from the
pool: Prefect empties its path and pull steps, and the pool's workers then fail to load its flow.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import serve

from config import RunConfig
from flows.replay import replay_flow
from flows.run import run_flow, run_tags

SERVED = "served"
REPLAY_DEPLOYMENT = SERVED  # replay/served; prefect.yaml's is replay/worker
REPLAY_DESCRIPTION = "Re-run one stage of a past rollout from its recorded inputs and report the first difference (rollflow replay)."


def run_deployment_name(cfg: RunConfig) -> str:
    """The name `rollflow serve` gives the run deployment of `cfg`: `<name>-served`."""
    return f"{cfg.name}-{SERVED}"


def deployments(cfg: RunConfig, *, cron: str | None = None, interval: int | None = None) -> list[Any]:
    """The two deployments `rollflow serve` serves: `rollflow-run/<name>-served`, whose served `cfg` is the fields
    `cfg` was given (the rest are RunConfig's defaults), and `replay/served` (run dir, rollout id, stage)."""
    run = run_flow.to_deployment(
        name=run_deployment_name(cfg),
        parameters={"cfg": cfg.model_dump(mode="json", exclude_unset=True)},
        cron=cron,
        interval=interval,
        description=f"rollflow run '{cfg.name}' (recipe {cfg.recipe}), served by rollflow serve",
        tags=run_tags(cfg),
    )
    replay = replay_flow.to_deployment(
        name=REPLAY_DEPLOYMENT,
        tags=["rollflow"],
        description=f"{REPLAY_DESCRIPTION} Served by rollflow serve.",
    )
    return [run, replay]


async def _work_pool_deployments(names: list[str]) -> list[tuple[str, str]]:
    """(name, work pool) of each deployment of `names` that exists and belongs to a work pool."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    found = []
    async with get_client() as client:
        for name in names:
            try:
                deployment = await client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if deployment.work_pool_name:
                found.append((name, deployment.work_pool_name))
    return found


def refuse_work_pool_deployments(cfg: RunConfig) -> None:
    """ValueError naming the first of `deployments(cfg)` that the server already has as a work pool's deployment
    (`prefect deploy`), and what to do: serving it would take it from the pool's workers."""
    run, replay = f"{run_flow.name}/{run_deployment_name(cfg)}", f"{replay_flow.name}/{REPLAY_DEPLOYMENT}"
    taken = asyncio.run(_work_pool_deployments([run, replay]))
    if taken:
        name, pool = taken[0]
        raise ValueError(
            f"rollflow serve will not take over deployment {name}: it belongs to work pool {pool!r} (prefect "
            f"deploy), whose workers run it; delete it (prefect deployment delete {name}) or rename it in "
            "prefect.yaml" + (", or serve a config of another name" if name == run else "")
        )


def serve_run(
    cfg: RunConfig, *, cron: str | None = None, interval: int | None = None, limit: int = 1
) -> None:
    """Block serving `deployments(cfg, ...)`, at most `limit` flow runs at a time. Call `refuse_work_pool_deployments`
    before: Prefect would take over a work pool's deployment of the same name."""
    serve(*deployments(cfg, cron=cron, interval=interval), limit=limit)
