"""The few places where megatron-core 0.16.1 reaches for CUDA on paths a CPU run takes.

Each patch replaces one upstream function with the same code but the CPU as the device, is applied
only when CUDA is not available (`apply()` does nothing on a GPU machine), and is idempotent. Nothing
here makes torch claim a GPU: `torch.cuda.is_available()` stays False and every other megatron path
that needs CUDA still fails loudly.

Not patches, but part of running on the CPU (see trainers/megatron/model.py): megatron's RNG tracker is
created with `initialize_rng_tracker(inference_rng_tracker=True)`, whose `fork()` is a no-op instead
of swapping CUDA generator states (harmless: ModelArch refuses dropout), and every forward gets a
boolean causal mask.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from contextlib import nullcontext
from functools import reduce
from typing import Any

import torch

_MARK = "_rollflow_cpu_patch"


def _global_buffer_get_tensor(self: Any, tensor_shape: Any, dtype: torch.dtype, name: str,
                              mem_alloc_context: Callable[[], Any] | None = None) -> torch.Tensor:
    """Replaces `megatron.core.utils.GlobalMemoryBuffer.get_tensor`: same reuse-or-grow buffer, allocated
    on the CPU instead of `torch.cuda.current_device()` (tensor-parallel all-gathers borrow it)."""
    required = reduce(operator.mul, tensor_shape, 1)
    buffer = self.buffer.get((name, dtype))
    if buffer is None or buffer.numel() < required:
        with (mem_alloc_context or nullcontext)():
            self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
    return self.buffer[(name, dtype)][0:required].view(*tensor_shape)


def _rotary_get_emb(self: Any, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """Replaces `megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding.get_emb`:
    the same [seq, 1, 1, dim] angles, without first moving `inv_freq` to `torch.cuda.current_device()`."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)
    if not self.rotary_interleaved:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    return emb[:, None, None, :]


def _replace(owner: type, attr: str, fn: Callable[..., Any]) -> None:
    if getattr(getattr(owner, attr), _MARK, False):
        return
    setattr(fn, _MARK, True)
    setattr(owner, attr, fn)


def apply() -> bool:
    """Install the CPU patches when CUDA is unavailable; returns whether they are (now) in place."""
    if torch.cuda.is_available():
        return False
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.utils import GlobalMemoryBuffer

    _replace(GlobalMemoryBuffer, "get_tensor", _global_buffer_get_tensor)
    _replace(RotaryEmbedding, "get_emb", _rotary_get_emb)
    return True
