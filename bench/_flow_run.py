"""A real run of the Prefect flow over Ray actors, as the benches time it: `flow_rollouts` runs `run_flow`
and reads each rollout's child flow run (and, for a `Timeline`, its task runs) back from Prefect;
`flow_perf` reads the run's `perf/*` metrics.

Importing this module sets what `rollflow run` sets before Prefect and Ray are imported (a throw-away Prefect
home unless ROLLFLOW_BENCH_PREFECT_HOME names one), and imports nothing a run's driver does not: a bench side
that measures a run's memory gets the driver's own.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TMP = Path(tempfile.mkdtemp(prefix="rf-bench-flow-"))
# before anything imports prefect or ray
# a caller may hand a Prefect home whose database is migrated already (the tests' copy): the server starts faster
os.environ["PREFECT_HOME"] = os.environ.get("ROLLFLOW_BENCH_PREFECT_HOME") or str(TMP / "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
if os.environ.get("ROLLFLOW_BENCH_LOGS") == "info":
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
else:
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from flows.cli import configure_prefect_env, configure_ray_env  # noqa: E402

configure_prefect_env()  # the Prefect settings `rollflow run` uses
configure_ray_env()  # and its Ray settings (before ray is imported)

from config import RunConfig  # noqa: E402


async def _child_runs(parent_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(like_="rollout-"),
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id]),
            )
        )
    return sorted(runs, key=lambda r: int(r.name.rsplit("-", 1)[1]))


@dataclass
class Timeline:
    """What --timeline reads back from Prefect: per task name, the (start, end) seconds of its task runs from
    their child flow run's start (the runs' ends under "(the flow run ends)"), and the rollouts left out of it
    because their flow run evaluated (not plain rollouts)."""

    tasks: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    evaluating: set[int] = field(default_factory=set)


def flow_rollouts(
    cfg: RunConfig, timeline: Timeline | None = None
) -> tuple[list[float], list[float], list[float], float, float]:
    """Run `run_flow`; return (per-rollout child flow-run seconds, start-to-start cadence seconds,
    end-to-next-start gap seconds, first child start -> last child end seconds, wall seconds of the whole
    run_flow call incl. Ray/actor start-up). `timeline`, if given, is filled from the children after the first."""
    import asyncio
    import time

    import ray

    from flows.run import run_flow

    start = time.perf_counter()
    try:
        state = asyncio.run(run_flow(cfg, return_state=True))
    finally:
        if ray.is_initialized():
            ray.shutdown()
    wall = time.perf_counter() - start
    if not state.is_completed():
        raise RuntimeError(f"run_flow ended {state.type}: {state.message}")
    runs = asyncio.run(_child_runs(state.state_details.flow_run_id))
    if len(runs) != cfg.rollout.num_rollout:
        raise RuntimeError(
            f"expected {cfg.rollout.num_rollout} rollout-* child runs, Prefect has {len(runs)}"
        )
    durations = [(r.end_time - r.start_time).total_seconds() for r in runs]
    cadence = [(b.start_time - a.start_time).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    gaps = [(b.start_time - a.end_time).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    span = (runs[-1].end_time - runs[0].start_time).total_seconds()
    if timeline is not None:
        asyncio.run(_task_timeline(runs[1:], timeline))
    return durations, cadence, gaps, span, wall


async def _task_timeline(runs: list, timeline: Timeline) -> None:
    """Fill `timeline` from the task runs of `runs` (one request a run: the server caps a listing at 200)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        for run in runs:
            tasks = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
            )
            spans = [
                (t.name.rsplit("-", 1)[0], t.start_time, t.end_time)
                for t in tasks
                if t.start_time and t.end_time
            ]
            if any(name.startswith("eval") for name, _, _ in spans):
                timeline.evaluating.add(int(run.name.rsplit("-", 1)[1]))
                continue
            for name, began, ended in [*spans, ("(the flow run ends)", run.end_time, run.end_time)]:
                since = [(x - run.start_time).total_seconds() for x in (began, ended)]
                timeline.tasks.setdefault(name, []).append((since[0], since[1]))


def flow_perf(run_dir: Path, skipped: set[int]) -> dict[str, list[float]]:
    """The flow's `perf/*` metrics per name (its metrics.jsonl), rollout 0 and the rollouts `skipped` left out."""
    from artifacts.store import RunPaths, read_metrics

    perf: dict[str, list[float]] = {}
    for record in read_metrics(RunPaths(run_dir).metrics):
        if record["kind"] == "perf" and record["rollout_id"] not in {0, *skipped}:
            for name, value in record["metrics"].items():
                perf.setdefault(name, []).append(value)
    return perf
