"""Tensor- and data-parallel collectives of the Megatron trainer: the vocab gather of the logits, the
data-parallel gradient sum (plain or deterministic), the tensor-parallel sum of the gradients each TP rank holds
only a part of, and the TP-aware global gradient norm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

from trainers.collectives import all_reduce_sum


@dataclass(frozen=True)
class Layout:
    """Where this process sits: TP groups are consecutive ranks, DP runs across them."""

    rank: int
    world_size: int
    tp_size: int
    tp_rank: int
    dp_size: int
    dp_rank: int
    tp_group: Any
    dp_group: Any

    @classmethod
    def current(cls) -> Layout:
        """Read megatron's parallel state (initialised by trainers.megatron.model.init_parallel)."""
        return cls(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            tp_size=parallel_state.get_tensor_model_parallel_world_size(),
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            dp_size=parallel_state.get_data_parallel_world_size(),
            dp_rank=parallel_state.get_data_parallel_rank(),
            tp_group=parallel_state.get_tensor_model_parallel_group(),
            dp_group=parallel_state.get_data_parallel_group(),
        )


class _GatherVocab(torch.autograd.Function):
    """All-gather along the last (vocab) dim in forward; each rank keeps its own slice of the gradient in
    backward (every TP rank computes the same loss from the gathered logits, so no sum is needed)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any) -> torch.Tensor:
        """[..., V/tp] -> [..., V]: this rank's slice, all-gathered in TP rank order."""
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.width, ctx.rank = local.shape[-1], rank
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """[..., V] -> [..., V/tp]: the gradient of this rank's own slice."""
        return grad[..., ctx.rank * ctx.width : (ctx.rank + 1) * ctx.width].contiguous(), None


def gather_vocab(local: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[..., V/tp] vocab-parallel logits -> [..., V] on every TP rank (identity for TP=1), differentiable."""
    if layout.tp_size == 1:
        return local
    return _GatherVocab.apply(local, layout.tp_group)


def sum_grads_over_dp(params: list[torch.nn.Parameter], layout: Layout, *, deterministic: bool) -> None:
    """Sum every parameter's gradient over the data-parallel group in place, as one flat buffer (one
    collective). Missing gradients count as zeros: every rank must join the collective."""
    if layout.dp_size > 1:
        _sum_grads(params, layout.dp_group, deterministic)


def sum_partial_grads_over_tp(
    params: list[torch.nn.Parameter], layout: Layout, *, deterministic: bool
) -> None:
    """Sum over the tensor-parallel group the gradients of replicated parameters that each TP rank applies to
    its own attention heads only (Qwen3's q/k layernorm), as megatron's finalize_model_grads does: each rank's
    gradient is a part of the whole, and the replicas must take the same step."""
    if layout.tp_size > 1 and params:
        _sum_grads(params, layout.tp_group, deterministic)


def _sum_grads(params: list[torch.nn.Parameter], group: Any, deterministic: bool) -> None:
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_sum(flat, deterministic=deterministic, group=group)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        p.grad = g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def clip_grad_norm(
    params: list[torch.nn.Parameter], max_norm: float, layout: Layout, *, deterministic: bool
) -> torch.Tensor:
    """Global L2 norm of all gradients before clipping (each parameter counted once: a tensor-parallel
    shard on every rank, a replicated one such as an RMSNorm weight on TP rank 0 only), then scale the
    gradients by min(1, max_norm / (norm + 1e-6)) exactly as `torch.nn.utils.clip_grad_norm_` does.
    With TP=1 the norm is computed by torch's own function, so it equals the torch backend's bitwise."""
    grads = [p.grad for p in params if p.grad is not None]
    if layout.tp_size == 1:
        total = torch.nn.utils.get_total_norm(grads, 2.0)
    else:
        mine = [p.grad for p in params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
        squared = (
            torch.nn.utils.get_total_norm(mine, 2.0).pow(2)
            if mine
            else torch.zeros((), device=params[0].device)
        )
        all_reduce_sum(squared, deterministic=deterministic, group=layout.tp_group)
        total = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
