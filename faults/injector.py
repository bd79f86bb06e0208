"""The per-process fault runtime: each engine, trainer rank and the orchestrator holds a `FaultInjector` with
the run's requests and calls `reach(hook, **context)` at its named points.

Every transition (pending, reached, scheduled, fired, failed, expired) is one line of `faults.jsonl` in the run
dir. "Fires at most once" holds across processes and restarts. A request is claimed by creating
`<run dir>/faults/<request_id>.claimed` with O_EXCL before it fires. So a restarted engine (same arguments,
same requests) or a second matching process never fires it again.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from faults.models import FaultHookRequest


class FiredFault(RuntimeError):
    """The `raise` action: an injected failure of the stage that reached the hook."""


class FaultInjector:
    """Fires this process's requests at its hooks (see the module docstring).

    `owner` is "engine", "trainer" or "orchestrator"; `index` the engine index or trainer rank; `run_dir` holds
    `faults.jsonl` and the claims (None: nothing is logged and claims are per process only); `epoch` is when the
    run started (time.time()), from which `lifetime_seconds` counts."""

    def __init__(
        self,
        requests: list[FaultHookRequest],
        owner: str,
        index: int | None = None,
        run_dir: str | None = None,
        epoch: float | None = None,
    ) -> None:
        self.owner, self.index = owner, index
        self.name = owner if index is None else f"{owner}-{index}"
        self.pending = [r for r in requests if r.targets(owner, index)]
        self.all_requests = list(requests)
        self.run_dir = Path(run_dir) if run_dir else None
        self.epoch = epoch if epoch is not None else time.time()
        self.context: dict[str, int | str | None] = {}
        self._local_claims: set[str] = set()

    def set_context(self, **context: int | str | None) -> None:
        """Context every later `reach` inherits (e.g. the rollout id, attempt and stage name of the stage being
        run); requests filter on rollout_id, attempt and weight_version only, the rest is logged."""
        self.context.update(context)

    def reach(self, hook: str, **context: int | str | None) -> None:
        """The process reached `hook`: fire each pending request for it whose filters match (at most once per
        run); a `raise` action raises FiredFault here, process actions do not return."""
        if not self.pending:
            return
        ctx = {**self.context, **context}
        now = time.time()
        for request in list(self.pending):
            if request.hook_name != hook:
                continue
            if request.lifetime_seconds is not None and now - self.epoch > request.lifetime_seconds:
                self.pending.remove(request)
                if self._claim(request, "expired"):
                    self._log(request, "expired", ctx)
                continue
            if not request.matches(ctx) or not self._claim(request, "claimed"):
                continue
            self.pending.remove(request)
            self._log(request, "reached", ctx)
            if request.delay_ms > 0:
                self._log(request, "scheduled", ctx)
                timer = threading.Timer(request.delay_ms / 1000, self._fire, args=(request, ctx))
                timer.daemon = True
                timer.start()
            else:
                self._fire(request, ctx)

    def log_pending(self) -> None:
        """Write a `pending` line for every request this process holds (the orchestrator does this once)."""
        for request in self.pending:
            self._log(request, "pending", {})

    def expire_unfired(self) -> None:
        """At the end of the run: every request no process ever fired ends `expired` (the orchestrator does
        this with the whole list)."""
        if self.run_dir is None:
            return
        for request in self.all_requests:
            if self._claim(request, "expired"):
                self._log(request, "expired", {})

    # -- claims and the audit log ------------------------------------------------------------------------
    def _claim(self, request: FaultHookRequest, what: str) -> bool:
        """True for the one process (and the one time) that gets to act on `request`."""
        if request.request_id in self._local_claims:
            return False
        self._local_claims.add(request.request_id)
        if self.run_dir is None:
            return True
        claims = self.run_dir / "faults"
        claims.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(
                claims / f"{request.request_id}.claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644
            )
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{what} by {self.name} pid {os.getpid()}\n")
        return True

    def _log(
        self, request: FaultHookRequest, status: str, ctx: dict[str, Any], error: str | None = None
    ) -> None:
        record = {
            "time": round(time.time(), 6),
            "request_id": request.request_id,
            "hook": request.hook_name,
            "action": request.action.kind,
            "status": status,
            "process": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "context": {k: v for k, v in ctx.items() if v is not None},
        }
        if error:
            record["error"] = error
        line = json.dumps(record, sort_keys=True) + "\n"
        if self.run_dir is None:
            return
        # one O_APPEND write per line, synced before the action runs: a process killed by its own fault still
        # leaves its "fired" line behind
        fd = os.open(self.run_dir / "faults.jsonl", os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- actions -----------------------------------------------------------------------------------------------
    def _fire(self, request: FaultHookRequest, ctx: dict[str, Any]) -> None:
        action = request.action
        self._log(request, "fired", ctx)
        where = (
            f"fault hook {request.request_id}: {action.kind} at {request.hook_name} in {self.name}"
            + "".join(f" {k} {v}" for k, v in ctx.items() if v is not None)
        )
        print(where, flush=True)
        if action.kind == "observe":
            return
        if action.kind == "raise":
            raise FiredFault(f"{where}: {action.message}")
        if action.kind == "sleep":
            time.sleep(action.seconds)
            return
        if action.kind == "exit_process":
            os._exit(action.code)
        if action.kind == "kill_process":
            os.kill(os.getpid(), signal.SIGKILL)
        if action.kind == "segfault_process":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        if action.kind == "stop_process":
            os.kill(os.getpid(), signal.SIGSTOP)
            return  # resumed by SIGCONT (usually the process is killed instead)
        if action.kind == "freeze_process":
            # PyDLL keeps the GIL held during the call: every Python thread of the process stops
            ctypes.PyDLL(None).sleep(int(action.seconds))
            return
        if action.kind == "deadlock_thread":
            threading.Event().wait()
        raise AssertionError(
            f"unhandled fault action {action.kind}"
        )  # pragma: no cover - the union is closed
