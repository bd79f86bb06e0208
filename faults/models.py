"""The fault hook request model (miles' `FaultHookRequest`, adapted to rollflow's processes).

A request names a hook, an action (a union on `kind`), an optional target and optional filters. The target is
`{"engine": i}` or `{"trainer_rank": r}`; none means every process that owns the hook. The filters apply to
the context the hook is reached in: `rollout_id`, `attempt` (the Prefect task's retry number from 0) and
`weight_version`. The context's `stage` is logged, not filtered on.
`delay_ms` schedules the action after the hook is reached; `lifetime_seconds` drops a request that has not
fired that long after the run started. Each request fires at most once in the whole run, restarts included.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from config.stages import STAGES, stage_end_hook

# hook name -> the kind of process that reaches it
HOOKS: dict[str, str] = {
    "engine_generate_start": "engine",
    "engine_update_weights_before_receive": "engine",
    "engine_update_weights_after_receive": "engine",
    "trainer_step_before_allreduce": "trainer",
    "trainer_export_weights_before_send": "trainer",
    "trainer_save_before_rename": "trainer",
    "rollout_finish_start": "rollout",
    "orchestrator_rollout_end": "orchestrator",
    # one per stage, reached at the end of its task: a fault between a stage's work and its records
    **{stage_end_hook(s): "orchestrator" for s in STAGES},
}

# where each named hook is reached (docs/reference/faults.md is generated from it); a stage's end hook is reached at
# the end of its task, after its actor work and files, before its records are logged
HOOK_POINTS: dict[str, str] = {
    "engine_generate_start": "an engine's generate call, before it checks its weight version and generates",
    "engine_update_weights_before_receive": "an engine's weight update, before it receives the trainer's weights",
    "engine_update_weights_after_receive": "an engine's weight update, the weights received, before they are loaded",
    "trainer_step_before_allreduce": "every optimizer step on each trainer rank, gradients computed, before their "
    "all-reduce",
    "trainer_export_weights_before_send": "a trainer rank's weight export for the sync, before anything is sent",
    "trainer_save_before_rename": "rank 0's --save checkpoint, written and flushed, before it is renamed into place "
    "(the recovery snapshots have no hook)",
    "rollout_finish_start": "the rollout actor, before it scores and writes a rollout from the engines' answers",
    "orchestrator_rollout_end": "the driver, once a rollout is done and recorded, before the next one starts",
    **{stage_end_hook(s): f"the end of the {s} stage's task" for s in STAGES},
}
if set(HOOK_POINTS) != set(HOOKS):
    raise AssertionError("HOOK_POINTS must say where each hook of HOOKS is reached")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Observe(_Strict):
    """Record that the hook was reached; do nothing."""

    kind: Literal["observe"] = "observe"


class Raise(_Strict):
    """Raise an exception in the reaching code (a stage that fails but whose process lives)."""

    kind: Literal["raise"] = "raise"
    message: str = "injected failure"


class ExitProcess(_Strict):
    """`os._exit(code)`: the process ends without cleanup."""

    kind: Literal["exit_process"] = "exit_process"
    code: int = Field(1, ge=0, le=255)


class KillProcess(_Strict):
    """SIGKILL to the reaching process."""

    kind: Literal["kill_process"] = "kill_process"


class SegfaultProcess(_Strict):
    """A null pointer read in C: SIGSEGV."""

    kind: Literal["segfault_process"] = "segfault_process"


class StopProcess(_Strict):
    """SIGSTOP: the process freezes in place (peers see a hang, not a death)."""

    kind: Literal["stop_process"] = "stop_process"


class FreezeProcess(_Strict):
    """Block the whole interpreter in a C-level sleep that holds the GIL (no Python thread runs)."""

    kind: Literal["freeze_process"] = "freeze_process"
    seconds: float = Field(600.0, gt=0, le=3600)


class DeadlockThread(_Strict):
    """The reaching thread waits forever on an event nobody sets; the process's other threads live on."""

    kind: Literal["deadlock_thread"] = "deadlock_thread"


class Sleep(_Strict):
    """Sleep at the hook (a slow stage)."""

    kind: Literal["sleep"] = "sleep"
    seconds: float = Field(gt=0, le=3600)


Action = Annotated[
    Observe
    | Raise
    | ExitProcess
    | KillProcess
    | SegfaultProcess
    | StopProcess
    | FreezeProcess
    | DeadlockThread
    | Sleep,
    Field(discriminator="kind"),
]
ACTION_KINDS = (
    "observe",
    "raise",
    "exit_process",
    "kill_process",
    "segfault_process",
    "stop_process",
    "freeze_process",
    "deadlock_thread",
    "sleep",
)


class Target(_Strict):
    """One engine (`{"engine": i}`) or one trainer rank (`{"trainer_rank": r}`)."""

    engine: int | None = Field(None, ge=0)
    trainer_rank: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one(self) -> Target:
        if (self.engine is None) == (self.trainer_rank is None):
            raise ValueError('a target names exactly one process: {"engine": i} or {"trainer_rank": r}')
        return self


class FaultHookRequest(_Strict):
    """One declared fault (see the module docstring)."""

    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    hook_name: str
    action: Action
    target: Target | None = None
    rollout_id: int | None = Field(None, ge=0)
    attempt: int | None = Field(None, ge=0)
    weight_version: int | None = Field(None, ge=0)
    delay_ms: float = Field(0.0, ge=0, le=300_000)
    lifetime_seconds: float | None = Field(None, gt=0, le=86_400)

    @field_validator("hook_name")
    @classmethod
    def _known_hook(cls, value: str) -> str:
        if value not in HOOKS:
            raise ValueError(f"unknown hook {value!r}; hooks are {sorted(HOOKS)}")
        return value

    @field_validator("delay_ms")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("delay_ms must be finite")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FaultHookRequest:
        owner = HOOKS[self.hook_name]
        if self.target is not None:
            wanted = "engine" if self.target.engine is not None else "trainer"
            if wanted != owner:
                raise ValueError(
                    f"{self.request_id}: hook {self.hook_name} is reached by the {owner}, so a "
                    f"{wanted} target can never match"
                )
        if self.action.kind == "deadlock_thread" and self.delay_ms > 0:
            raise ValueError(
                f"{self.request_id}: deadlock_thread deadlocks the reaching thread, so it needs delay_ms 0"
            )
        return self

    @property
    def owner(self) -> str:
        return HOOKS[self.hook_name]

    def targets(self, owner: str, index: int | None) -> bool:
        """Whether this request can fire in the process `owner` (engine/trainer/rollout/orchestrator) number
        `index`."""
        if owner != self.owner:
            return False
        if self.target is None:
            return True
        return index == (self.target.engine if owner == "engine" else self.target.trainer_rank)

    def matches(self, context: dict[str, int | str | None]) -> bool:
        """Whether every non-null filter equals the reached context (a missing context value never matches)."""
        for name in ("rollout_id", "attempt", "weight_version"):
            want = getattr(self, name)
            if want is not None and context.get(name) != want:
                return False
        return True


_LIST = TypeAdapter(list[FaultHookRequest])


def parse_requests(text: str | None = None, path: str | None = None) -> list[FaultHookRequest]:
    """The requests of `--ci-fault-hooks JSON` or `--ci-fault-hooks-path FILE` (one of them, or neither);
    ValueError naming the flag, the request and the field for bad input, and for conflicting requests."""
    if text is not None and path is not None:
        raise ValueError("--ci-fault-hooks and --ci-fault-hooks-path are mutually exclusive")
    flag = "--ci-fault-hooks" if text is not None else "--ci-fault-hooks-path"
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"--ci-fault-hooks-path {path}: no such file")
        text = p.read_text()
        flag = f"--ci-fault-hooks-path {path}"
    if text is None or not text.strip():
        return []
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if isinstance(raw, dict):
        raw = [raw]
    try:
        requests = _LIST.validate_python(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"{flag}: request {where}: {err['msg']}") from None
    _check_conflicts(requests, flag)
    return requests


def _check_conflicts(requests: list[FaultHookRequest], flag: str) -> None:
    """A request id is used once; two requests with the same hook, action, target and filters conflict (only one
    of them could ever fire)."""
    seen: dict[str, FaultHookRequest] = {}
    shapes: dict[tuple[Any, ...], str] = {}
    for r in requests:
        if r.request_id in seen:
            raise ValueError(f"{flag}: request id {r.request_id!r} is used twice")
        seen[r.request_id] = r
        shape = (r.hook_name, r.action, r.target, r.rollout_id, r.attempt, r.weight_version)
        if shape in shapes:
            raise ValueError(
                f"{flag}: requests {shapes[shape]!r} and {r.request_id!r} conflict: same hook, action, "
                "target and filters"
            )
        shapes[shape] = r.request_id
