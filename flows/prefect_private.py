"""Every place rollflow relies on Prefect beyond its public API, in one module; tests/unit/test_prefect_private.py
fails when Prefect changes what these rely on.

- `retry_busy_server_quickly`: wraps `PrefectHttpxAsyncClient._send_with_retry` / `PrefectHttpxSyncClient.
  _send_with_retry(request, send, ...)` (prefect.client.base), which honours a Retry-After header and has no
  setting for its back-off.
- `start_temporary_server`, `temporary_server_pids`: `SubprocessASGIServer` (prefect.server.api.server), one
  instance per port, is the temporary server Prefect starts for a client without PREFECT_API_URL; its
  `_instances` registry is the only handle on that server's process.
"""

from __future__ import annotations

import sys
from typing import Any

# The first waits after a 503 "database is locked" (the embedded server's SQLite refused a write: in WAL mode a
# transaction that read before another one committed fails at once, SQLITE_BUSY_SNAPSHOT, whatever the busy
# timeout): the conflict is gone milliseconds later, but Prefect's client, seeing no Retry-After header, waits
# 2, 4, 8 s -- a stall of the whole loop, rollout flow runs and task runs are created in line. From the fourth
# busy answer to a request on, Prefect's own back-off (16, 32 s) applies: a server that stays busy is not
# hammered, and a request still fails after about 50 s of it (Prefect alone: 62 s).
_BUSY_RETRY_SECONDS = ("0.05", "0.25", "1")


class _QuickBusyRetry:
    """One request's busy answers so far: the first `_BUSY_RETRY_SECONDS` of them get a Retry-After header."""

    def __init__(self) -> None:
        self.busy = 0

    def mark(self, response: Any) -> Any:
        if (
            response.status_code == 503
            and "Retry-After" not in response.headers
            and self.busy < len(_BUSY_RETRY_SECONDS)
        ):
            response.headers["Retry-After"] = _BUSY_RETRY_SECONDS[self.busy]
            self.busy += 1
        return response


def retry_busy_server_quickly() -> None:
    """Make this process's Prefect clients (async and sync) retry a busy server (503 without Retry-After) after
    `_BUSY_RETRY_SECONDS` for its first three busy answers to a request, then as Prefect would. Idempotent.

    Prefect's `_send_with_retry(request, send, ...)` honours a Retry-After header and has no setting for its
    back-off, so each response that `send` returns passes `_QuickBusyRetry.mark` first."""
    from prefect.client import base

    async_cls, sync_cls = base.PrefectHttpxAsyncClient, base.PrefectHttpxSyncClient
    if getattr(async_cls._send_with_retry, "_rollflow_quick", False):
        return
    async_original, sync_original = async_cls._send_with_retry, sync_cls._send_with_retry

    async def send_async(self: Any, request: Any, send: Any, *args: Any, **kwargs: Any) -> Any:
        quick = _QuickBusyRetry()

        async def send_once(*a: Any, **kw: Any) -> Any:
            return quick.mark(await send(*a, **kw))

        return await async_original(self, request, send_once, *args, **kwargs)

    def send_sync(self: Any, request: Any, send: Any, *args: Any, **kwargs: Any) -> Any:
        quick = _QuickBusyRetry()
        return sync_original(self, request, lambda *a, **kw: quick.mark(send(*a, **kw)), *args, **kwargs)

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


def start_temporary_server() -> None:
    """Start the temporary Prefect server now, as Prefect would at a flow's first request: the same instance, which
    the flow's client then finds running."""
    from prefect.server.api.server import SubprocessASGIServer

    SubprocessASGIServer().start()
