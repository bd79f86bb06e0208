"""Every place rollflow relies on Prefect beyond its public API, in one module; tests/unit/test_prefect_private.py
fails when Prefect changes what these rely on.

- `retry_busy_server_quickly`: wraps `PrefectHttpxAsyncClient._send_with_retry` / `PrefectHttpxSyncClient.
  _send_with_retry(request, send, ...)` (prefect.client.base), which calls `send` once per attempt and has no
  setting for its back-off.
- `start_temporary_server`, `temporary_server_pids`: `SubprocessASGIServer` (prefect.server.api.server), one
  instance per port, is the temporary server Prefect starts for a client without PREFECT_API_URL. Its
  `_instances` registry is the only handle on that server's process. It starts that process with the module's
  `subprocess.Popen`.
- `route_sigterm`: every flow run, nested ones included, installs `prefect.utilities.engine.
  _prefect_sigterm_handler` for SIGTERM (over any other handler), and a runner's cancel is acknowledged only while
  that function is the installed handler; both look it up as a module global.
- `intend_cancel`, `clear_cancel_intent`, `cancel_intended`, `runner_managed`: Prefect's engine ends a flow
  run Cancelled (not Crashed) when the asyncio cancellation that stops it comes with the "cancel" intent of
  its control listener (`prefect._internal.control_listener`). A runner sets that intent before it kills a
  flow run it cancels. A runner's flow run process has `PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS=false`
  (prefect.flow_engine).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

# The waits after a 503 "database is locked". In WAL mode a SQLite transaction that read before another one
# committed fails at once (SQLITE_BUSY_SNAPSHOT), whatever the busy timeout. The conflict is gone milliseconds
# later. But Prefect's client, seeing no Retry-After header, waits 2, 4, 8, 16 s. That stalls the whole loop:
# rollout flow runs and task runs are created in line. With several runs on one server, a request can meet
# writes at several attempts in a row. So busy answers are retried here first, after these waits (about 8 s in
# all, at most one attempt a second). Then Prefect's own back-off (2, 4, 8, 16, 32 s) applies, so a server that
# stays busy is not hammered. A request still fails after about 70 s (Prefect alone: 62 s).
_BUSY_RETRY_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
_async_sleep, _sync_sleep = asyncio.sleep, time.sleep  # module names: a test replaces them


class _QuickBusyRetry:
    """One request's busy answers so far: each of the first `len(_BUSY_RETRY_SECONDS)` is retried here."""

    def __init__(self) -> None:
        self.busy = 0

    def wait(self, response: Any) -> float | None:
        """Seconds to wait before sending the request again, or None: `response` goes to Prefect's retry loop."""
        if (
            response.status_code != 503
            or "Retry-After" in response.headers
            or self.busy >= len(_BUSY_RETRY_SECONDS)
        ):
            return None
        self.busy += 1
        return _BUSY_RETRY_SECONDS[self.busy - 1]


def retry_busy_server_quickly() -> None:
    """Make this process's Prefect clients (async and sync) retry a busy server (503 without Retry-After) after
    `_BUSY_RETRY_SECONDS` for its first busy answers to a request, then as Prefect would. Idempotent.

    Prefect's `_send_with_retry(request, send, ...)` calls `send` once per attempt and has no setting for its
    back-off, so the `send` it gets sends again itself while `_QuickBusyRetry.wait` says so."""
    from prefect.client import base

    async_cls, sync_cls = base.PrefectHttpxAsyncClient, base.PrefectHttpxSyncClient
    if getattr(async_cls._send_with_retry, "_rollflow_quick", False):
        return
    async_original, sync_original = async_cls._send_with_retry, sync_cls._send_with_retry

    async def send_async(self: Any, request: Any, send: Any, *args: Any, **kwargs: Any) -> Any:
        quick = _QuickBusyRetry()

        async def send_once(*a: Any, **kw: Any) -> Any:
            while (seconds := quick.wait(response := await send(*a, **kw))) is not None:
                await response.aclose()
                await _async_sleep(seconds)
            return response

        return await async_original(self, request, send_once, *args, **kwargs)

    def send_sync(self: Any, request: Any, send: Any, *args: Any, **kwargs: Any) -> Any:
        quick = _QuickBusyRetry()

        def send_once(*a: Any, **kw: Any) -> Any:
            while (seconds := quick.wait(response := send(*a, **kw))) is not None:
                response.close()
                _sync_sleep(seconds)
            return response

        return sync_original(self, request, send_once, *args, **kwargs)

    send_async._rollflow_quick = True  # type: ignore[attr-defined]
    async_cls._send_with_retry = send_async  # type: ignore[method-assign]
    sync_cls._send_with_retry = send_sync  # type: ignore[method-assign]


def temporary_server_pids() -> list[int]:
    """The pids of the temporary Prefect servers this process started and that still run (none when it talks to
    a `rollflow server`)."""
    # imported only where a temporary server was started
    module = sys.modules.get("prefect.server.api.server")
    servers = getattr(module, "SubprocessASGIServer", None)
    started = [s.server_process for s in (servers._instances.values() if servers else [])]
    return [p.pid for p in started if p is not None and p.poll() is None]


class _OwnSession:
    """`subprocess` as `prefect.server.api.server` sees it: a temporary server started in a session of its own."""

    def __getattr__(self, name: str) -> Any:
        import subprocess

        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 (subprocess's name)
        import subprocess

        return subprocess.Popen(*args, **{**kwargs, "start_new_session": True})


def start_temporary_server() -> None:
    """Start the temporary Prefect server now, as Prefect would at a flow's first request: the same instance, which
    the flow's client then finds running. It runs in a session of its own. A Ctrl-C in the terminal (SIGINT to
    the whole foreground process group) stops the run, which still needs the server to record that it was
    cancelled. The run stops the server at its exit (and its reaper if it is killed)."""
    from prefect.server.api import server

    server.subprocess = _OwnSession()  # type: ignore[assignment]
    server.SubprocessASGIServer().start()


def intend_cancel() -> bool:
    """Mark the stop that follows as a cancel, as a runner does before it kills a flow run it cancels: Prefect's
    engine then ends the flow runs it interrupts Cancelled. False (nothing changed) when an intent is already set
    (the runner's own)."""
    from prefect._internal import control_listener

    with control_listener._intent_lock:
        if control_listener._intent is not None:
            return False
        control_listener._intent = "cancel"
    return True


def clear_cancel_intent() -> None:
    """Forget an intent `intend_cancel` set (the next flow run of this process starts without one)."""
    from prefect._internal import control_listener

    control_listener.clear_intent()


def cancel_intended() -> bool:
    """Whether this process's flow runs are being cancelled (by `intend_cancel` or by a runner)."""
    from prefect._internal import control_listener

    return control_listener.get_intent() == "cancel"


def runner_managed() -> bool:
    """Whether this process is a flow run that a runner started (a worker's or `serve`'s): the runner cancels it
    through its control channel and Prefect's SIGTERM handler, which must stay installed."""
    import os

    return os.environ.get("PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS", "true").lower() == "false"


def route_sigterm(handler: Any) -> Any:
    """Make `handler(signum, frame)` the SIGTERM handler every flow run of this process installs, in place of
    Prefect's, which raises `TerminationSignal` wherever the main thread is. Returns Prefect's, for `handler`
    to fall back on. Idempotent for the same `handler`."""
    from prefect.utilities import engine

    original = getattr(engine, "_rollflow_prefect_sigterm_handler", engine._prefect_sigterm_handler)
    engine._rollflow_prefect_sigterm_handler = original  # type: ignore[attr-defined]
    engine._prefect_sigterm_handler = handler
    return original
