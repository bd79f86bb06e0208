"""What flows/prefect_private.py relies on in Prefect still holds: these fail when Prefect changes it.

A busy embedded Prefect server (SQLite "database is locked": 503 without Retry-After) is retried after
0.05, 0.25 and 1 s instead of Prefect's 2, 4 and 8 s, and only for the first three busy answers to a request;
by the async client and the sync one. The temporary server's process is found through its class's registry."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest
from prefect.client import base as client_base

from flows.prefect_private import retry_busy_server_quickly, temporary_server_pids


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
def test_the_first_three_busy_answers_are_retried_quickly_then_prefect_backs_off(monkeypatch, sync):
    retry_busy_server_quickly()
    waits: list[float] = []
    status, answers = _busy_then_ok(4, waits, monkeypatch, sync)
    assert status == 200 and answers == [503, 503, 503, 503, 200]
    assert waits[0] < 0.1 and waits[1] < 0.5 and waits[2] < 1.5  # Prefect alone: about 2, 4 and 8 s
    assert waits[3] >= 8.0  # the fourth busy answer: Prefect's own exponential back-off, not hammering


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
