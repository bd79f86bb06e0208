"""Sum reductions of the training world, plain or deterministic.

The deterministic variant (`--debug-deterministic-collective`, miles' method) all-gathers every
rank's tensor and folds them in a fixed order (a pairwise tree when the world size is a power of
two, ascending rank order otherwise), so the result is bitwise independent of how the backend
would have ordered the additions. Slow: for debugging only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist


def fixed_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Fold `parts` (one per rank, rank order) in a fixed order: pairwise tree for 2^k, else ascending."""
    n = len(parts)
    if n & (n - 1) == 0:
        level = list(parts)
        while len(level) > 1:
            level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
        return level[0]
    total = parts[0].clone()
    for p in parts[1:]:
        total = total + p
    return total


def all_reduce_sum(
    tensor: torch.Tensor, *, deterministic: bool = False, group: dist.ProcessGroup | None = None
) -> None:
    """In-place SUM across `group` (default: the default process group); a no-op for a group of one.
    Deterministic: the parts are folded in the group's rank order."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    if not deterministic:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    tensor.copy_(fixed_order_sum(parts))


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def init_method(master_addr: str, master_port: int, rendezvous_dir: str | Path) -> str:
    """The process group's rendezvous. On one machine (a loopback master) a file store under `rendezvous_dir`:
    torch's TCPStore listens on every interface whatever address it is given, and a file store opens no socket
    at all (gloo's own connections stay on GLOO_SOCKET_IFNAME, loopback by default). Across machines, TCP at the
    rank-0 node's address."""
    if master_addr in LOOPBACK:
        path = Path(rendezvous_dir) / f"rendezvous-{master_port}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"file://{path}"
    return f"tcp://{master_addr}:{master_port}"


def rendezvous_host(nodes: Sequence[tuple[str, str]]) -> str:
    """The process group's rendezvous host, from each rank's (node id, node ip) in rank order. Ranks that all
    share one node meet on loopback: init_method then keeps the file store (no listening socket; the run dir is
    that node's, or on the filesystem every node shares). Ranks on several nodes meet at rank 0's node IP over
    TCP. Nodes are told apart by id, not IP: two Ray nodes may share a machine (ray.cluster_utils.Cluster)."""
    if len({node for node, _ in nodes}) <= 1:
        return LOOPBACK[0]
    return nodes[0][1]


def gloo_interface(node_ip: str) -> str | None:
    """The network interface whose IPv4 address is `node_ip` (gloo's GLOO_SOCKET_IFNAME for it); None when no
    interface has it. Asks the kernel (SIOCGIFADDR, Linux) rather than a library: nothing else here needs one."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(answer[20:24]) == node_ip:
                return name
    return None


def use_interface_for(master_addr: str, node_ip: str) -> None:
    """Point gloo at the interface of this node's IP when the group spans nodes: the loopback interface that a
    one-machine run pins it to (flows.cli.configure_ray_env) cannot reach another machine. A user's own choice of
    another interface is kept."""
    if master_addr in LOOPBACK or os.environ.get("GLOO_SOCKET_IFNAME", "lo") != "lo":
        return
    interface = gloo_interface(node_ip)
    if interface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    else:  # gloo then resolves the hostname: better than loopback, which surely cannot reach the other nodes
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
