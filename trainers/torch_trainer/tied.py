"""One dense gradient for a weight that is both the input embedding and the output layer (tied embeddings).

Autograd gives such a weight two gradients in a backward: the output layer's, dense [V, H], early, and the
embedding lookup's, also dense [V, H] although only the looked-up rows are non-zero, at the very end, where
every other gradient already exists. Their sum is then formed in place. At 0.5B (V = 151,936, H = 896) that
second dense gradient is 0.5 GiB of float32 on top of everything at the backward's peak; a sparse embedding
gradient does not help, because autograd adds a sparse gradient to a dense one out of place.

`TiedGrad` collects both into one buffer instead: the output layer hands its gradient over (`take_dense`), each
lookup adds its rows into it (`tied_embedding`'s backward, `index_add_`), and the last lookup's backward returns
the buffer as the weight's gradient. Each micro-batch's gradient is still formed on its own and only then added
to .grad, so data-parallel 1 with two micro-batches still equals data-parallel 2 with one each. A gradient the
output layer hands over after the last lookup has returned is refused and takes autograd's usual way, and a
backward that ends with a handed-over gradient never returned is an error: nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class TiedGrad:
    """The shared gradient buffer of one forward's tied weight: ``lookups`` embedding calls that have not run
    their backward yet, and the [V, H] float32 buffer their rows and the output layer's gradient go into."""

    def __init__(self) -> None:
        self.lookups = 0
        self.buffer: Tensor | None = None

    def take_dense(self, grad: Tensor) -> bool:
        """The output layer's [V, H] gradient: kept (True) while a lookup's backward is still to come; refused
        (False: the caller returns it to autograd) when none is."""
        if self.lookups == 0:
            return False
        if self.buffer is None:
            self._hold(grad)
        else:
            self.buffer.add_(grad)
        return True

    def add_rows(self, ids: Tensor, grad_rows: Tensor, weight: Tensor) -> Tensor | None:
        """One lookup's backward: ``grad_rows`` [n, H] added at rows ``ids`` [n]; returns the buffer when this
        was the last lookup (the weight's whole gradient from this forward), else None (a later lookup returns it)."""
        buffer = self.buffer if self.buffer is not None else self._hold(torch.zeros_like(weight))
        buffer.index_add_(0, ids, grad_rows.to(buffer.dtype))
        self.lookups -= 1
        if self.lookups > 0:
            return None
        self.buffer = None
        return buffer

    def _hold(self, buffer: Tensor) -> Tensor:
        """Keep `buffer` as the gradient, checked at the end of this backward to have been returned."""
        self.buffer = buffer
        torch.autograd.Variable._execution_engine.queue_callback(self._check_returned)
        return buffer

    def _check_returned(self) -> None:
        if self.buffer is not None:
            raise RuntimeError(
                "a tied embedding's gradient was handed over by the output layer but no embedding lookup's "
                f"backward returned it ({self.lookups} lookup(s) never ran their backward)"
            )


class _TiedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: Tensor, weight: Tensor, padding_idx: int | None, tied: TiedGrad) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.padding_idx, ctx.tied, ctx.weight = padding_idx, tied, weight
        return F.embedding(ids, weight, padding_idx=padding_idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor | None, None, None]:
        (ids,) = ctx.saved_tensors
        rows, grad_rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:  # as F.embedding: the padding row gets no gradient from the inputs
            keep = rows != ctx.padding_idx
            rows, grad_rows = rows[keep], grad_rows[keep]
        return None, ctx.tied.add_rows(rows, grad_rows, ctx.weight), None, None


def tied_embedding(ids: Tensor, weight: Tensor, padding_idx: int | None, tied: TiedGrad | None) -> Tensor:
    """``F.embedding(ids, weight, padding_idx)``: [*] ids, [V, H] -> [*, H], bitwise. With ``tied`` (while
    autograd records), its gradient goes through ``tied`` (see the module docstring)."""
    if tied is None or not (torch.is_grad_enabled() and weight.requires_grad):
        return F.embedding(ids, weight, padding_idx=padding_idx)
    tied.lookups += 1
    out: Tensor = _TiedEmbedding.apply(ids, weight, padding_idx, tied)
    return out
