"""Does the Prefect timeline tell the truth? Every actor call a stage stands for must run inside a task run of
that stage: start after the task run starts, end before it ends (DESIGN.md section 2, "The timeline is the
truth"). This module measures it for one run, from Ray's timeline and the task runs Prefect recorded.

What each side records (Ray 2.60, Prefect 3.9, both read on one host's wall clock):
- `ray.timeline()` returns chrome-trace dicts; an actor method call is one event with `cat`
  "task::<Class>.<method>" (e.g. "task::EngineActor.generate"; a named actor's creation
  "task::<actor name>:<Class>.__init__"; `name` is the bare method), `ph` "X", `ts` its start and `dur` its
  length in microseconds, `ts` since the Unix epoch (the actor's node's wall clock), and `args` {"name",
  "task_id"}. The event spans the call in the actor's worker (its arguments' deserialization, the method,
  storing its outputs), not the wait in the caller or in the actor's queue. The task id's last 8 hex digits
  are the id of the Ray job that created the actor. Workers report their events once a second
  (`RAY_task_events_report_interval_ms`): the calls of an actor's last moments before `ray.kill` are lost
  unless that interval is shorter than the time from them to the kill.
- A task run's `start_time` / `end_time` are the timestamps of its Running and final states, taken by the
  process that ran it (Prefect's task engine runs tasks client-side). Its name is the task's name and
  "-<first 3 characters of its dynamic key>" (`generate-0`, `log-prob-1`). Its `task_key` is the function's
  name and a source hash (`log_prob-...`). So the stage is the run's name without that suffix (`stage_of`).

`attribute` is pure (calls and task runs in, a `SpanReport` out); `read_run_spans` reads a run's flow and task
runs from Prefect; `measure` does both for a run that `flows.run.run_flow` just ran in this Ray session.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Among a method's stages: its calls may also run outside every rollout flow run and task run (the weight
# queries of the run's start-up).
START_UP = "start-up"

# Actor method -> the stages whose task runs may hold its calls (any one of them). A method not listed
# (health, stats, node, free_port, setup, prepare, load, shutdown, get_weights, __init__, ...) belongs to the
# actors' start-up, recovery or shut-down. It is reported in its own row. It is a violation only when it runs
# inside a rollout's flow run outside all of its task runs.
METHOD_STAGES: dict[str, tuple[str, ...]] = {
    "EngineActor.generate": ("generate", "eval"),
    "RolloutActor.finish_rollout": ("generate", "eval"),
    "EngineActor.release_memory": ("log-prob",),
    "TrainerActor.compute_log_probs": ("log-prob",),
    "TrainerActor.rollout_stats": ("log-prob",),
    "TrainerActor.train_step": ("train-step",),
    "TrainerActor.perf": ("train-step",),
    "EngineActor.resume_memory": ("sync",),
    "EngineActor.snapshot_and_scramble": ("sync",),
    "EngineActor.update_weights": ("sync",),
    "EngineActor.load_weight_bucket": ("sync",),
    "EngineActor.commit_weights": ("sync",),
    "TrainerActor.export_weights": ("sync",),
    "TrainerActor.stream_weights": ("sync",),
    "TrainerActor.stream_summary": ("sync",),
    "TrainerActor.write_snapshot": ("sync",),
    "EngineActor.weight_version": ("sync", "check", START_UP),
    "EngineActor.weights_sha256": ("sync", "check", START_UP),
    "EngineActor.tensor_hashes": ("sync", "check", START_UP),
    "TrainerActor.weights_sha256": ("sync", "check", START_UP),
    "TrainerActor.tensor_hashes": ("sync", "check", START_UP),
    "TrainerActor.save": ("save",),
}

# The stages in the order a report lists them.
STAGES: tuple[str, ...] = tuple(
    dict.fromkeys(s for stages in METHOD_STAGES.values() for s in stages if s != START_UP)
)

_CALL_PREFIX = "task::"


class Call(NamedTuple):
    """One actor method call as Ray's timeline recorded it; times in seconds since the Unix epoch."""

    method: str  # "<Class>.<method>", e.g. "EngineActor.generate"
    start: float
    end: float


class TaskRun(NamedTuple):
    """One Prefect task run; times in seconds since the Unix epoch."""

    stage: str  # the task's name: "generate", "log-prob", "save" (`stage_of` the run's name)
    flow_run: str  # the name of the flow run it ran in: "rollout-3", "run/<name>"
    start: float
    end: float


class FlowRunSpan(NamedTuple):
    """A flow run's name and its start and end, in seconds since the Unix epoch."""

    name: str
    start: float
    end: float


@dataclass(frozen=True)
class RunSpans:
    """What Prefect recorded of one run: its parent flow run, its `rollout-<id>` child flow runs, and the task
    runs that ran. Those are the parent's own (its first sync, its saves) and the children's."""

    parent: FlowRunSpan
    rollouts: list[FlowRunSpan]
    tasks: list[TaskRun]


@dataclass
class StageRow:
    """One stage's calls, as `attribute` counts them.
    - `calls`: how many were attributed to the stage.
    - `early` and `late`: those outside every task run their method may run in, by more than the tolerance.
      Early is a head start: the call began outside every such task run, before one that starts later. Late:
      it began in one and outlasted it, or came after the last.
    - `worst_ms`: the worst excess; `math.inf` when no task run of the method's stages exists at all.
    - `offenders`: the methods of the calls outside, counted."""

    calls: int = 0
    early: int = 0
    late: int = 0
    worst_ms: float = 0.0
    offenders: Counter[str] = field(default_factory=Counter)

    @property
    def outside(self) -> int:
        return self.early + self.late


@dataclass
class OtherRow:
    """The calls of methods that no stage stands for (start-up, recovery, shut-down), and of the start-up's
    weight queries outside every rollout, by method. `between_tasks` counts the violations: calls inside a
    rollout's flow run but outside all of its task runs, work the timeline shows in no task."""

    calls: int = 0
    between_tasks: int = 0
    methods: Counter[str] = field(default_factory=Counter)
    offenders: Counter[str] = field(default_factory=Counter)


@dataclass
class SpanReport:
    """Per stage (`STAGES` order) its calls; the calls of no stage; the tolerance it was measured with."""

    stages: dict[str, StageRow]
    other: OtherRow
    tolerance_ms: float

    @property
    def stage_violations(self) -> int:
        """Stage calls outside every task run of their stages."""
        return sum(row.outside for row in self.stages.values())

    @property
    def violations(self) -> int:
        """Stage calls outside their task runs, and other calls between the tasks of a rollout."""
        return self.stage_violations + self.other.between_tasks

    def table(self) -> str:
        """The report as a plain-text table, one row per stage and one for the rest, and the total line."""
        rows = [["stage", "calls", "outside", "early", "late", "worst excess ms", "methods outside"]]
        for stage, r in self.stages.items():
            worst = "-" if not r.outside else "no task run" if math.isinf(r.worst_ms) else f"{r.worst_ms:.1f}"
            counts = [str(n) for n in (r.calls, r.outside, r.early, r.late)]
            rows.append([stage, *counts, worst, _counted(r.offenders)])
        o = self.other
        rows.append(["start-up etc.", str(o.calls), str(o.between_tasks), "", "", "-", _counted(o.offenders)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.append(
            f"violations: {self.violations} ({self.stage_violations} stage calls outside their task runs, "
            f"{o.between_tasks} start-up/recovery/shut-down calls between a rollout's tasks; tolerance "
            f"{self.tolerance_ms:g} ms)"
        )
        return "\n".join(lines)


def _counted(counter: Counter[str]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counter.most_common())


def stage_of(run_name: str, dynamic_key: str | None = None) -> str:
    """The task's name in a task run's name: Prefect names a run `<task name>-<dynamic key[:3]>`; without the
    dynamic key, the name before the last "-"."""
    if dynamic_key is not None and run_name.endswith(f"-{dynamic_key[:3]}"):
        return run_name[: -len(dynamic_key[:3]) - 1]
    return run_name.rsplit("-", 1)[0]


def actor_calls(
    events: Iterable[Mapping[str, Any]],
    *,
    window: tuple[float, float] | None = None,
    job_id: str | None = None,
) -> list[Call]:
    """The actor method calls among `ray.timeline()`'s events, sorted by start. `window` (seconds since the
    epoch): only the calls that overlap it; `job_id` (hex, as `ray.get_runtime_context().get_job_id()`): only
    the calls of actors that job created (an event without a task id is kept)."""
    calls = []
    for e in events:
        cat = e.get("cat", "")
        if not cat.startswith(_CALL_PREFIX) or e.get("ph") != "X":
            continue
        if job_id is not None:
            task_id = (e.get("args") or {}).get("task_id")
            if task_id and not task_id.endswith(job_id):
                continue
        start = e["ts"] / 1e6
        # a named actor's creation is "<actor name>:<Class>.__init__"
        method = cat[len(_CALL_PREFIX) :].rsplit(":", 1)[-1]
        call = Call(method, start, start + e.get("dur", 0.0) / 1e6)
        if window is None or (call.end >= window[0] and call.start <= window[1]):
            calls.append(call)
    return sorted(calls, key=lambda c: c.start)


def excess(call: Call, task: TaskRun | FlowRunSpan) -> float:
    """Seconds `call` runs outside `task`'s span: before it starts or after it ends (the larger; 0 inside)."""
    return max(task.start - call.start, call.end - task.end, 0.0)


def attribute(calls: Iterable[Call], spans: RunSpans, tolerance_ms: float = 5.0) -> SpanReport:
    """Each call attributed to a stage (`METHOD_STAGES`) or to the rest, and checked against the task runs.

    A stage call is inside when a task run of one of its method's stages holds it to within `tolerance_ms`
    (different processes read the two clocks). It goes to the stage of the task run holding it with the least
    excess. A call of a method allowed at START_UP that overlaps no rollout flow run is the start-up's. Any
    other stage call is outside:
    - early when it began outside every such task run and before one of them starts (a head start): its excess
      runs to that task run's start, and its stage is that run's;
    - else late: its excess and stage are those of the nearest such task run it began in, or of the nearest
      one.

    A call of any other method is the rest's. It is between tasks when it overlaps a rollout flow run while no
    task run holds it."""
    tol = tolerance_ms / 1000
    stages = {s: StageRow() for s in STAGES}
    other = OtherRow()
    for call in calls:
        in_rollout = any(call.start < r.end + tol and call.end > r.start - tol for r in spans.rollouts)
        allowed = METHOD_STAGES.get(call.method)
        if allowed is None:
            other.calls += 1
            other.methods[call.method] += 1
            if in_rollout and all(excess(call, t) > tol for t in spans.tasks):
                other.between_tasks += 1
                other.offenders[call.method] += 1
            continue
        runs = [t for t in spans.tasks if t.stage in allowed]
        holding = [t for t in runs if excess(call, t) <= tol]
        if holding:  # the one holding it best: a quick call just after one task run may lie in the next
            stages[min(holding, key=lambda t: excess(call, t)).stage].calls += 1
            continue
        if START_UP in allowed and not in_rollout:
            other.calls += 1
            other.methods[call.method] += 1
            continue
        began_in = [t for t in runs if t.start - tol <= call.start <= t.end + tol]
        later = [t for t in runs if t.start > call.start]
        if not began_in and later:
            ahead_of = min(later, key=lambda t: t.start)
            stage, worst, early = ahead_of.stage, ahead_of.start - call.start, True
        elif runs:
            nearest = min(began_in or runs, key=lambda t: excess(call, t))
            stage, worst, early = nearest.stage, excess(call, nearest), False
        else:
            stage, worst, early = allowed[0], math.inf, False
        row = stages.setdefault(stage, StageRow())
        row.calls += 1
        row.early += early
        row.late += not early
        row.worst_ms = max(row.worst_ms, 1000 * worst)
        row.offenders[call.method] += 1
    return SpanReport(stages, other, tolerance_ms)


async def read_run_spans(parent_flow_run_id: uuid.UUID, *, settle: float = 10.0) -> RunSpans:
    """The run whose parent flow run is `parent_flow_run_id`, as Prefect recorded it (`get_client()`'s
    server). That is the parent, its `rollout-<id>` children, and the task runs of both that started (a cached
    one ran nothing), without the parent's runs that track a child. The server records task runs from events,
    in batches. So this reads again, for up to `settle` seconds, until every task run is final and a second
    read finds no new one. A task run with no end yet is taken to end with its flow run. ValueError if the
    parent has not ended."""
    import time

    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    async with get_client() as client:
        parent = await client.read_flow_run(parent_flow_run_id)
        if parent.start_time is None or parent.end_time is None:
            raise ValueError(f"flow run {parent.name} ({parent_flow_run_id}) has not ended")
        parent_span = FlowRunSpan(parent.name, parent.start_time.timestamp(), parent.end_time.timestamp())
        children = await _all(
            client.read_flow_runs,
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent.id])),
        )
        rollouts = {
            c.id: FlowRunSpan(
                c.name,
                c.start_time.timestamp(),
                c.end_time.timestamp() if c.end_time is not None else parent_span.end,
            )
            for c in children
            if c.name.startswith("rollout-") and c.start_time is not None
        }
        flow_runs = {parent.id: parent_span, **rollouts}
        tracking = {c.parent_task_run_id for c in children}
        deadline, seen = time.monotonic() + settle, -1
        while True:
            runs = await _all(
                client.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_runs)))
            )
            settled = len(runs) == seen and all(r.state is not None and r.state.is_final() for r in runs)
            if settled or time.monotonic() > deadline:
                break
            seen = len(runs)
            await anyio.sleep(0.2)
    tasks = [
        TaskRun(
            stage_of(r.name, r.dynamic_key),
            flow_runs[r.flow_run_id].name,
            r.start_time.timestamp(),
            r.end_time.timestamp() if r.end_time is not None else flow_runs[r.flow_run_id].end,
        )
        for r in runs
        if r.start_time is not None and r.id not in tracking and r.flow_run_id in flow_runs
    ]
    return RunSpans(
        parent_span,
        sorted(rollouts.values(), key=lambda f: f.start),
        sorted(tasks, key=lambda t: t.start),
    )


async def _all(read: Any, **filters: Any) -> list[Any]:
    """Every row of a paged Prefect listing (the server returns at most 200 a request)."""
    rows: list[Any] = []
    while True:
        page = await read(**filters, limit=200, offset=len(rows))
        rows.extend(page)
        if len(page) < 200:
            return rows


async def run_calls(spans: RunSpans, *, this_job: bool = True) -> list[Call]:
    """The actor calls Ray's timeline holds within the span of `spans`' parent flow run. Needs this process
    connected to the run's Ray session, after the run ended; `this_job`: only the calls of actors this Ray job
    created (`run_flow`'s in this process; a served deployment's detached actors belong to the job that
    created them). Ray's timeline names no actor's namespace: the span and the job tell runs apart."""
    import anyio
    import ray

    events = await anyio.to_thread.run_sync(ray.timeline)  # it waits a second for the workers' last reports
    job = ray.get_runtime_context().get_job_id() if this_job else None
    return actor_calls(events, window=(spans.parent.start, spans.parent.end), job_id=job)


async def measure(
    parent_flow_run_id: uuid.UUID, tolerance_ms: float = 5.0, *, this_job: bool = True
) -> SpanReport:
    """`attribute` over the run's task runs as Prefect recorded them (`read_run_spans`) and its actor calls as
    Ray's timeline holds them (`run_calls`)."""
    spans = await read_run_spans(parent_flow_run_id)
    return attribute(await run_calls(spans, this_job=this_job), spans, tolerance_ms)
