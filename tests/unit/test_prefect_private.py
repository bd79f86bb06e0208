"""What flows/prefect_private.py relies on in Prefect still holds: these fail when Prefect changes it.

A busy Prefect server (SQLite "database is locked": 503 without Retry-After) is retried after 0.05 s and then
at most once a second, for about 8 s, instead of after Prefect's 2, 4, 8, 16 s; then with Prefect's own
back-off; by the async client and the sync one. The temporary server's process is found through its class's
registry."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest
from prefect.client import base as client_base

import flows.prefect_private
from flows.prefect_private import _BUSY_RETRY_SECONDS, retry_busy_server_quickly, temporary_server_pids


def _busy_then_ok(busy: int, waits: list[float], monkeypatch, sync: bool) -> tuple[int, list[int]]:
    """Send one request to a server that answers 503 `busy` times, then 200; record the client's waits."""
    answers: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        code = 503 if len(answers) < busy else 200
        answers.append(code)
        return httpx.Response(code, text="database is locked" if code == 503 else "ok")

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(client_base.anyio, "sleep", no_sleep)
    monkeypatch.setattr(client_base.time, "sleep", waits.append)  # the sync client's wait (the test's only)
    monkeypatch.setattr(flows.prefect_private, "_async_sleep", no_sleep)
    monkeypatch.setattr(flows.prefect_private, "_sync_sleep", waits.append)
    url = "http://prefect.test/api"
    if sync:
        with client_base.PrefectHttpxSyncClient(
            transport=httpx.MockTransport(handler), base_url=url
        ) as client:
            return client.get("/health").status_code, answers

    async def send() -> int:
        async with client_base.PrefectHttpxAsyncClient(
            transport=httpx.MockTransport(handler), base_url=url
        ) as client:
            return (await client.get("/health")).status_code

    return asyncio.run(send()), answers


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_busy_answers_are_retried_quickly_for_a_while_then_prefect_backs_off(monkeypatch, sync):
    retry_busy_server_quickly()
    waits: list[float] = []
    quick = len(_BUSY_RETRY_SECONDS)
    status, answers = _busy_then_ok(quick + 2, waits, monkeypatch, sync)
    assert status == 200 and answers == [503] * (quick + 2) + [200]
    assert waits[0] < 0.1 and max(waits[:quick]) <= 1.0  # Prefect alone: 2, 4, 8, 16 s
    assert 6.0 < sum(waits[:quick]) < 10.0  # a busy stretch of seconds costs about its own length
    # then Prefect's own exponential back-off (2, 4 s, with its jitter): a server that stays busy is not hammered
    assert 1.5 < waits[quick] < 2.5 and 3.0 < waits[quick + 1] < 5.0


def test_the_patch_is_applied_once_and_other_answers_pass_through(monkeypatch):
    retry_busy_server_quickly()
    patched = client_base.PrefectHttpxAsyncClient._send_with_retry
    retry_busy_server_quickly()
    assert client_base.PrefectHttpxAsyncClient._send_with_retry is patched
    waits: list[float] = []
    assert _busy_then_ok(0, waits, monkeypatch, sync=False) == (200, [200]) and waits == []


@pytest.mark.parametrize("cls", ["PrefectHttpxAsyncClient", "PrefectHttpxSyncClient"])
def test_prefects_send_with_retry_takes_the_request_and_the_send_function(cls):
    params = list(inspect.signature(getattr(client_base, cls)._send_with_retry).parameters)
    assert params[:3] == ["self", "request", "send"]


def test_the_temporary_servers_are_found_through_their_class_registry(monkeypatch):
    from prefect.server.api.server import SubprocessASGIServer

    assert isinstance(SubprocessASGIServer._instances, dict)

    class Process:
        pid = 4242

        def poll(self):
            return None  # still running

    class Ended(Process):
        def poll(self):
            return 0

    class Server:
        def __init__(self, process):
            self.server_process = process  # the attribute Prefect sets when it starts the server

    monkeypatch.setattr(SubprocessASGIServer, "_instances", {1: Server(Process()), 2: Server(Ended())})
    assert temporary_server_pids() == [4242]
    assert "server_process" in inspect.getsource(SubprocessASGIServer.start)


def test_the_temporary_server_is_one_instance_per_port_with_a_start():
    from prefect.server.api.server import SubprocessASGIServer

    assert (
        SubprocessASGIServer() is SubprocessASGIServer()
    )  # what the flow's client finds is what was started
    assert callable(SubprocessASGIServer.start)


def test_the_temporary_server_starts_through_its_modules_subprocess_popen():
    from prefect.server.api import server

    source = inspect.getsource(server.SubprocessASGIServer._run_uvicorn_command)
    assert "subprocess.Popen(" in source  # what start_temporary_server gives a session of its own
    from flows.prefect_private import _OwnSession

    assert _OwnSession().TimeoutExpired is __import__("subprocess").TimeoutExpired  # the rest is subprocess's


def test_every_flow_run_installs_the_routed_sigterm_handler_and_acks_a_runners_cancel_with_it():
    import signal

    from prefect.utilities import engine

    from flows import stop  # noqa: F401  (routes SIGTERM at import)
    from flows.prefect_private import route_sigterm

    handler = engine._prefect_sigterm_handler
    assert handler.__module__ == "flows.stop"
    assert route_sigterm(handler) is engine._rollflow_prefect_sigterm_handler  # idempotent: Prefect's kept
    # capture_sigterm installs the module global, and a runner's intent is acknowledged only while it is installed
    assert "signal.SIGTERM, _prefect_sigterm_handler" in inspect.getsource(engine.capture_sigterm)
    assert "is not _prefect_sigterm_handler" in inspect.getsource(engine.commit_control_intent_and_ack)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with engine.capture_sigterm():
            assert signal.getsignal(signal.SIGTERM) is handler
            assert engine.is_prefect_sigterm_handler_installed()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_cancel_intent_is_what_the_engine_reads_and_is_never_set_over_a_runners():
    from prefect import flow_engine
    from prefect._internal import control_listener

    from flows.prefect_private import cancel_intended, clear_cancel_intent, intend_cancel

    assert '_termination_intent() == "cancel"' in inspect.getsource(flow_engine)
    try:
        assert intend_cancel() and cancel_intended() and control_listener.get_intent() == "cancel"
        clear_cancel_intent()
        control_listener._set_intent("reschedule")  # a runner's
        assert not intend_cancel() and control_listener.get_intent() == "reschedule"
    finally:
        clear_cancel_intent()
    assert not cancel_intended()


def test_a_runners_flow_run_is_told_by_the_variable_the_engine_reads(monkeypatch):
    from prefect import flow_engine

    from flows.prefect_private import runner_managed

    assert "PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS" in inspect.getsource(flow_engine)
    monkeypatch.setenv("PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS", "false")
    assert runner_managed()
    monkeypatch.delenv("PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS")
    assert not runner_managed()
