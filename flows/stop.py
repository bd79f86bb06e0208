"""Stopping a run: Ctrl-C, SIGTERM and a cancel from Prefect (the UI's Cancel, `prefect flow-run cancel`) end a
run the same way, within seconds.

The stop is one asyncio cancellation of the run flow's task, marked as a cancel for Prefect's engine
(`prefect_private.intend_cancel`). So the rollout flow run it interrupts and the run's flow run end Cancelled.
Prefect marks the stage task it interrupts Crashed; `mark_interrupted` marks it Cancelled too. The run's
`finally` blocks then stop the actors. A rollout counts once the parent has logged its step time, and every
file a stage writes is written whole or not at all. So the run resumes from its last complete rollout. A
second Ctrl-C exits at once (the reaper, flows/reaper.py, stops Ray and Prefect's temporary server).

A flow run that a runner started (a worker's, `rollflow serve`'s) is cancelled by its runner. The runner sets
the cancel intent through its control channel, then sends SIGTERM, which stops the run the same way. The
runner marks it Cancelled. It sets the intent only while Prefect's SIGTERM bridge is the installed handler, so
`tasks.actors.ensure_ray` keeps Ray's `init` from replacing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from config import RunConfig
from flows import prefect_private, runtime

CTRL_C, SIGTERM, PREFECT_CANCEL = "Ctrl-C", "SIGTERM", "a cancel from Prefect"
EXIT_CODES = {CTRL_C: 130, SIGTERM: 143, PREFECT_CANCEL: 1}


class Stopper:
    """Stops the run flow's task once, however asked; remembers why."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task
        self.reason: str | None = None

    def request(self, reason: str) -> None:
        """Stop the run because of `reason`. Safe from another thread and from a signal handler; a second Ctrl-C
        ends the process at once."""
        if self.reason is not None:
            if reason == CTRL_C:
                os.write(2, b"\nrollflow: second Ctrl-C: exiting now\n")
                os._exit(EXIT_CODES[CTRL_C])
            return
        self.reason = reason
        prefect_private.intend_cancel()
        self.loop.call_soon_threadsafe(self.task.cancel)


_last: Stopper | None = None


def stop_reason() -> str | None:
    """Why this process's last run was stopped (`CTRL_C`, `SIGTERM`, `PREFECT_CANCEL`), None if it was not."""
    if _last is not None and _last.reason is not None:
        return _last.reason
    return PREFECT_CANCEL if prefect_private.cancel_intended() else None  # a runner cancelled it


_line: str | None = None


def stopped_line(done: int, total: int, run_dir: object) -> str | None:
    """When the run was stopped: the line it ends on (why, where, how to continue), also kept for `last_line`.
    None when it was not stopped (it failed)."""
    global _line
    reason = stop_reason()
    if reason is None:
        return None
    where = f"in rollout {done}" if done < total else "after its last rollout"
    _line = (
        f"stopped by {reason} {where} ({done}/{total} rollouts complete); continue with "
        f"`rollflow run --resume {run_dir}`"
    )
    return _line


def last_line() -> str | None:
    """The line of this process's last stopped run (`stopped_line`), None before any."""
    return _line


_active: Stopper | None = None  # the stopper of the run flow now running in this process


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM during a run stops it (a runner's cancel comes as a SIGTERM too, its intent set first); outside
    one, Prefect's own handler."""
    stopper = _active
    if stopper is None:
        _prefect_sigterm(signum, frame)
        return
    stopper.request(PREFECT_CANCEL if prefect_private.cancel_intended() else SIGTERM)


# every flow run installs this handler for SIGTERM, nested rollout flow runs included (flows/prefect_private.py)
_prefect_sigterm = prefect_private.route_sigterm(_on_sigterm)


@contextlib.contextmanager
def stoppable(cfg: RunConfig, flow_run_id: str) -> Iterator[Stopper]:
    """While inside (the run flow's body, on its event loop): Ctrl-C and SIGTERM stop the run. So does a
    cancel of flow run `flow_run_id` seen by the API watchdog (`runtime.api_watchdog`, which also ends the
    process when the API stops answering). A runner's flow run is cancelled by its runner instead. Once
    stopped, Prefect's console lines about the flow and task runs the stop interrupts stay off the console
    (they are in the run's log and in the UI)."""
    global _last, _active
    if _last is not None and _last.reason is not None:
        prefect_private.clear_cancel_intent()  # an earlier run of this process was stopped
    task = asyncio.current_task()
    assert task is not None, "stoppable() runs inside the run flow's task"
    stopper = _last = _active = Stopper(asyncio.get_running_loop(), task)
    managed = prefect_private.runner_managed()
    ctrl_c = None
    if threading.current_thread() is threading.main_thread():
        ctrl_c = signal.signal(signal.SIGINT, lambda *_: stopper.request(CTRL_C))
    quiet = _QuietAfterStop(stopper)
    consoles = _prefect_consoles()
    for handler in consoles:
        handler.addFilter(quiet)
    on_cancel = None if managed else (lambda: stopper.request(PREFECT_CANCEL))
    try:
        with runtime.api_watchdog(cfg, flow_run_id, on_cancel):
            yield stopper
    finally:
        _active = None
        if ctrl_c is not None:
            signal.signal(signal.SIGINT, ctrl_c)
        if stopper.reason is None:  # a stopped run's last lines (Prefect's at exit too) stay off the console
            for console in consoles:
                console.removeFilter(quiet)


class _QuietAfterStop(logging.Filter):
    """Drops Prefect's records once the run is being stopped: its crash and cancel lines for the runs the stop
    interrupts would bury the run's one stop line."""

    def __init__(self, stopper: Stopper) -> None:
        super().__init__()
        self.stopper = stopper

    def filter(self, record: logging.LogRecord) -> bool:
        return self.stopper.reason is None or not record.name.startswith("prefect")


def _prefect_consoles() -> list[logging.Handler]:
    """Prefect's console handlers, on whichever loggers its logging config put them."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict))]
    found: list[logging.Handler] = []
    for logger in loggers:
        found += [h for h in logger.handlers if isinstance(h, PrefectConsoleHandler) and h not in found]
    return found


async def mark_interrupted(parent_flow_run_id: str, reason: str, *, wait: float = 5.0) -> None:
    """Mark what a stop interrupted Cancelled, with `reason`:
    - a rollout flow run it caught before Prefect's engine ran it (left Pending);
    - the task runs of the run's flow run and of its rollout flow runs that Prefect's engine marked Crashed
      ("cancelled by the runtime environment").
    Task run states reach the server as events, recorded in batches about once a second. So this reads until
    none of those task runs is left unfinished, for a batch's time at least and `wait` seconds at most. Then
    it marks any still unfinished Cancelled too."""
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
    from prefect.states import Cancelled

    parent = uuid.UUID(parent_flow_run_id)
    async with get_client() as client:
        children = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))
        )
        for child in children:
            if child.state is not None and not child.state.is_final():
                await client.set_flow_run_state(
                    child.id, Cancelled(message=f"the run was stopped by {reason}"), force=True
                )
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[parent, *(c.id for c in children)]))
        began = time.monotonic()
        while True:
            tasks = await client.read_task_runs(flow_run_filter=runs)
            for run in tasks:
                state = run.state
                if (
                    state is not None
                    and state.is_crashed()
                    and "cancelled by the runtime" in (state.message or "")
                ):
                    await client.set_task_run_state(
                        run.id, Cancelled(message=f"the run was stopped by {reason}"), force=True
                    )
            unfinished = [t for t in tasks if t.state is not None and not t.state.is_final()]
            elapsed = time.monotonic() - began
            if not unfinished and elapsed > 1.2:
                return
            if elapsed > wait:  # their final state never reached the server: the stop is theirs too
                for run in unfinished:
                    await client.set_task_run_state(
                        run.id, Cancelled(message=f"the run was stopped by {reason}"), force=True
                    )
                return
            await anyio.sleep(0.2)
