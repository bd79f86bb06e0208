"""`--ray-address` checked before `ray.init`: that something answers there, that it is a Ray cluster, and that
the cluster takes this client's token. Left to `ray.init`, an address where nothing answers is reported as a
missing token, and a refused token as a connection timeout after 20-30 s."""

from __future__ import annotations

import os
import socket

RAY_CLIENT = "ray://"
RAY_CLIENT_PORT = 10001  # Ray Client's default port, as `ray.init("ray://host")` assumes
# one harmless call of each server, answered at once by a Ray of this version; only its status matters here
_PROBES = {
    False: "/ray.rpc.NodeInfoGcsService/GetClusterId",  # the GCS, `host:port`
    True: "/ray.rpc.RayletDriver/ClusterInfo",  # the Ray Client server, `ray://host:port`
}
TIMEOUT = 5.0  # seconds for the TCP connect and for the probe call
TOKEN_SOURCES = "RAY_AUTH_TOKEN / ~/.ray/auth_token"


class RayAddressError(ValueError):
    """`--ray-address` cannot be joined; the message is one line naming the address and why."""


def parse(address: str) -> tuple[str, int, bool]:
    """(host, port, is Ray Client) of a GCS address `HOST:PORT` or a Ray Client address `ray://HOST[:PORT]`;
    RayAddressError for anything else."""
    client = address.startswith(RAY_CLIENT)
    rest = address.removeprefix(RAY_CLIENT) if client else address
    host, sep, port = rest.rpartition(":")
    if not sep or "]" in port:  # no port (an IPv6 host's last colon is inside its brackets)
        host, port = rest, str(RAY_CLIENT_PORT) if client else ""
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RayAddressError(
            f"--ray-address {address}: expected HOST:PORT (a cluster's GCS, as `ray start --head` prints it) or "
            f"ray://HOST[:PORT] (its Ray Client server)"
        )
    return host, int(port), client


def check_ray_address(address: str) -> None:
    """Raise RayAddressError, in one line, unless `address` (`parse`) answers a TCP connect, answers as a Ray
    GCS or Ray Client server does, and takes the token `ray.init` would send (none with RAY_AUTH_MODE=disabled).
    `auto` and `local` (Ray finds or starts the cluster itself) are left to `ray.init`."""
    if address in ("auto", "local"):
        return
    host, port, client = parse(address)
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
    except OSError as e:
        raise RayAddressError(
            f"--ray-address {address}: nothing answers at {host}:{port} ({e.strerror or e})"
        ) from None
    _probe(address, f"{host}:{port}" if ":" not in host else f"[{host}]:{port}", client)


def _probe(address: str, target: str, client: bool) -> None:
    """One call of the server at `target` with this client's token: refused (UNAUTHENTICATED), not answered as
    gRPC, or fine (any other status: it ran the call or refused its empty request)."""
    import grpc

    header = _token_header()
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(_PROBES[client], request_serializer=None, response_deserializer=None)
        try:
            call(b"", timeout=TIMEOUT, metadata=tuple(header.items()))
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise RayAddressError(
                    f"--ray-address {address}: the cluster refused this client's token ({TOKEN_SOURCES})"
                    if header
                    else f"--ray-address {address}: the cluster needs a token and this client has none "
                    f"({TOKEN_SOURCES})"
                ) from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                kind = "a Ray Client server (ray://)" if client else "a Ray cluster's GCS (HOST:PORT)"
                raise RayAddressError(
                    f"--ray-address {address}: {target} answers, but not as {kind} does"
                ) from None
    if not header and os.environ.get("RAY_AUTH_MODE", "token").lower() != "disabled":
        raise RayAddressError(
            f"--ray-address {address}: this client has no Ray token ({TOKEN_SOURCES}); the cluster takes "
            "clients without one: join it with RAY_AUTH_MODE=disabled"
        )


def _token_header() -> dict[str, str]:
    """The authorization metadata `ray.init` sends (Ray's own token loader: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
    ~/.ray/auth_token), empty without a token or with RAY_AUTH_MODE=disabled."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() == "disabled":
        return {}
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    return dict(AuthenticationTokenLoader.instance().get_token_for_http_header(ignore_auth_mode=True))
