"""--ray-address is checked before ray.init: nothing answering, something that is not Ray, and a refused token
each get a line of their own."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from tasks.ray_address import RayAddressError, check_ray_address, parse


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _not_ray() -> Iterator[int]:
    """A port that accepts connections and answers them as an HTTP/1 server would."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()


@contextlib.contextmanager
def _grpc_server(token: str | None) -> Iterator[int]:
    """A gRPC server that, as Ray's GCS does with token authentication on, refuses every call without
    `Bearer <token>` (UNAUTHENTICATED) and answers the others UNIMPLEMENTED; `None`: no authentication."""

    class Handler(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            metadata = dict(details.invocation_metadata)

            def call(request: bytes, context: grpc.ServicerContext) -> bytes:
                if token is not None and metadata.get("authorization") != f"Bearer {token}":
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken")
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "not this one")
                return b""  # abort raised

            return grpc.unary_unary_rpc_method_handler(call)

    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


@pytest.fixture
def token(monkeypatch, tmp_path) -> Iterator[str]:
    """This client's Ray token (RAY_AUTH_TOKEN), with no ~/.ray/auth_token behind it."""
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    value = "a" * 32
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", value)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    AuthenticationTokenLoader.instance().reset_cache()
    yield value
    monkeypatch.undo()
    AuthenticationTokenLoader.instance().reset_cache()


def test_a_closed_port_is_reported_as_nothing_answering(token):
    port = _closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(
            RayAddressError, match=rf"^--ray-address {address}: nothing answers at 127.0.0.1:{port} "
        ):
            check_ray_address(address)


def test_a_port_that_is_not_ray_is_named_so(token):
    with _not_ray() as port, pytest.raises(RayAddressError) as e:
        check_ray_address(f"127.0.0.1:{port}")
    assert (
        str(e.value)
        == f"--ray-address 127.0.0.1:{port}: 127.0.0.1:{port} answers, but not as a Ray cluster's GCS (HOST:PORT) does"
    )


def test_a_refused_token_is_reported_as_such_and_the_right_one_passes(token):
    with _grpc_server("b" * 32) as port:
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            with pytest.raises(RayAddressError) as e:
                check_ray_address(address)
            assert str(e.value) == (
                f"--ray-address {address}: the cluster refused this client's token "
                "(RAY_AUTH_TOKEN / ~/.ray/auth_token)"
            )
    with _grpc_server(token) as port:
        check_ray_address(f"127.0.0.1:{port}")
        check_ray_address(f"ray://127.0.0.1:{port}")


def test_without_a_token_the_line_says_so(token, monkeypatch):
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    monkeypatch.delenv("RAY_AUTH_TOKEN")
    AuthenticationTokenLoader.instance().reset_cache()
    with (
        _grpc_server(token) as port,
        pytest.raises(RayAddressError, match="needs a token and this client has none"),
    ):
        check_ray_address(f"127.0.0.1:{port}")
    with _grpc_server(None) as port, pytest.raises(RayAddressError, match="RAY_AUTH_MODE=disabled"):
        check_ray_address(f"127.0.0.1:{port}")
    monkeypatch.setenv(
        "RAY_AUTH_MODE", "disabled"
    )  # the user's explicit choice, for a cluster without tokens
    with _grpc_server(None) as port:
        check_ray_address(f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("10.0.0.1:6379", ("10.0.0.1", 6379, False)),
        ("ray://head:10002", ("head", 10002, True)),
        ("ray://head", ("head", 10001, True)),
        ("[::1]:6379", ("::1", 6379, False)),
    ],
)
def test_address_forms(address, parsed):
    assert parse(address) == parsed


@pytest.mark.parametrize("address", ["head", "head:", "head:port", "head:70000", "ray://", ":6379", "[::1]"])
def test_malformed_addresses_are_refused_in_one_line(address):
    with pytest.raises(RayAddressError, match=rf"^--ray-address {re.escape(address)}: expected HOST:PORT"):
        parse(address)


def test_the_probed_methods_are_this_rays():
    """The probe calls a method of each server, which must exist (a server answers UNIMPLEMENTED for another one
    before it checks the token)."""
    from ray.core.generated import gcs_service_pb2_grpc, ray_client_pb2_grpc

    from tasks.ray_address import _PROBES

    service, method = _PROBES[False].rsplit("/", 1)
    assert (
        service == "/ray.rpc.NodeInfoGcsService"
        and method in gcs_service_pb2_grpc.NodeInfoGcsServiceServicer.__dict__
    )
    service, method = _PROBES[True].rsplit("/", 1)
    assert service == "/ray.rpc.RayletDriver" and method in ray_client_pb2_grpc.RayletDriverServicer.__dict__
