"""Sum reductions of the training world, plain or deterministic.

The deterministic variant (`--debug-deterministic-collective`, miles' method) all-gathers every
rank's tensor and folds them in a fixed order (a pairwise tree when the world size is a power of
two, ascending rank order otherwise), so the result is bitwise independent of how the backend
would have ordered the additions. Slow: for debugging only.
"""

from __future__ import annotations

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


def all_reduce_sum(tensor: torch.Tensor, *, deterministic: bool = False,
                   group: dist.ProcessGroup | None = None) -> None:
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
