"""The root cause of a failed run, as one line: the checker's violation or the fault / error message, without
the wrappers it reaches the driver in.

An exception raised in an actor arrives as Ray's `RayTaskError(X)` (its text: `ray::EngineActor.generate()
(pid=..., ip=...)`, ANSI colour codes and the remote traceback), possibly nested when one actor waited for
another; Prefect hands a failed child flow run's exception on as it is, but a state read back without its
exception becomes `FailedRun("Flow run encountered an exception: X: ...")` / `CrashedRun(...)`, and the
texts keep Ray's wrapper. `failure_line` strips all of that down to `X: message`, and names the rollout and stage
the exception came from when `note_stage` marked it there.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# the messages Prefect puts in front of an exception's `Type: message` in a failed / crashed state
_PREFECT_PREFIX = re.compile(
    r"^(?:Crash detected! )?(?:Flow run encountered an exception:?|Task run encountered an "
    r"exception:?|Execution was interrupted by an unexpected exception:)\s*"
)
_RAY_WRAPPED = re.compile(r"^RayTaskError\(\w+\):")
# `module.path.ClassName: message`, the last line of a Python traceback (class names are CamelCase)
_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*([A-Z]\w*)(?::\s*(.*))?$")
STAGE_NOTE = "rollflow: in "  # the start of the note `note_stage` adds


def note_stage(exc: BaseException, rollout_id: int, stage: str) -> None:
    """Record on `exc` (once: the innermost stage wins) the rollout and stage it was raised in; the note also
    shows under the traceback in the run's logs."""
    if not any(n.startswith(STAGE_NOTE) for n in getattr(exc, "__notes__", [])):
        exc.add_note(f"{STAGE_NOTE}rollout {rollout_id}, stage {stage}")


def root_cause(exc: BaseException) -> BaseException:
    """The exception inside the wrappers: `RayTaskError.cause` (also nested), and a one-exception group."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        cause = _ray_cause(exc)
        if cause is not None:
            exc = cause
        elif isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        else:
            break
    return exc


def _ray_cause(exc: BaseException) -> BaseException | None:
    from ray.exceptions import RayTaskError

    if isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException) and exc.cause is not exc:
        return exc.cause
    return None


def describe(exc: BaseException) -> str:
    """`Type: message` of the root cause on one line: Prefect's prefixes, Ray's wrapper text and ANSI colour codes
    removed, whitespace collapsed."""
    from prefect.exceptions import CancelledRun, CrashedRun, FailedRun

    cause = root_cause(exc)
    if isinstance(cause, FailedRun | CrashedRun | CancelledRun):  # only text survived: "Flow run ...: X: msg"
        text = unwrap_text(str(cause))
    else:
        text = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    return " ".join(_ANSI.sub("", text).split())


def unwrap_text(text: str) -> str:
    """A state message reduced to its exception: Prefect's prefix dropped and, when the rest is Ray's
    `RayTaskError(X): ray::... traceback`, the traceback's last exception line (`X: message`, module dropped)."""
    text = _PREFECT_PREFIX.sub("", _ANSI.sub("", text).strip())
    if not _RAY_WRAPPED.match(text):
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        found = _EXCEPTION_LINE.match(line)
        if found:
            name, message = found.groups()
            return f"{name}: {message}" if message else name
    return lines[-1]


def stage_of(exc: BaseException) -> str | None:
    """`rollout N, stage S` when `note_stage` marked `exc` (or an exception it wraps)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for note in getattr(current, "__notes__", []):
            if note.startswith(STAGE_NOTE):
                return note.removeprefix(STAGE_NOTE)
        current = _ray_cause(current)
    return None


def explain(exc: BaseException) -> str:
    """The root cause for a summary: `X: message (rollout N, stage S)`."""
    where = stage_of(exc)
    return describe(exc) + (f" ({where})" if where else "")


def failure_line(exc: BaseException) -> str:
    """What the CLI prints last for a failed run: `rollflow: run failed at rollout N, stage S: X: message`."""
    where = stage_of(exc)
    return f"rollflow: run failed{f' at {where}' if where else ''}: {describe(exc)}"
