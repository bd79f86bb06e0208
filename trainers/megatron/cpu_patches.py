"""The few places where megatron-core 0.16.1 reaches for CUDA on paths a CPU run takes.

Each patch replaces one upstream function with the same code but the CPU as the device. They are
installed (idempotently) by a process that runs its Megatron model on the CPU, and only then: a process
runs megatron on one kind of device, and `trainers.megatron.model.init_parallel` refuses a CUDA model
in a process that installed them. Nothing here makes torch claim a GPU: `torch.cuda.is_available()` is
untouched and every other megatron path that needs CUDA still fails loudly.

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


def _global_buffer_get_tensor(
    self: Any,
    tensor_shape: Any,
    dtype: torch.dtype,
    name: str,
    mem_alloc_context: Callable[[], Any] | None = None,
) -> torch.Tensor:
    """Replaces `megatron.core.utils.GlobalMemoryBuffer.get_tensor`: same reuse-or-grow buffer, allocated
    on the CPU instead of `torch.cuda.current_device()` (DotProductAttention's baddbmm output borrows it)."""
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


def _get_rng_states() -> tuple[torch.Tensor, None, dict[str, Any]]:
    """Replaces `megatron.core.tensor_parallel.random._get_all_rng_states` (what activation recomputation saves
    before a checkpointed forward): the CPU generator's state and the tracker's, no CUDA generator's."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return torch.get_rng_state(), None, get_cuda_rng_tracker().get_states()


def _set_rng_states(cpu_state: torch.Tensor, cuda_state: None, tracker_states: dict[str, Any]) -> None:
    """Replaces `megatron.core.tensor_parallel.random._set_all_rng_states`: restores what `_get_rng_states` saved."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    del cuda_state
    torch.set_rng_state(cpu_state)
    get_cuda_rng_tracker().set_states(tracker_states)


def _replace(owner: Any, attr: str, fn: Callable[..., Any]) -> None:
    if getattr(getattr(owner, attr), _MARK, False):
        return
    setattr(fn, _MARK, True)
    setattr(owner, attr, fn)


def apply() -> None:
    """Install the CPU patches (a no-op when they are in place already)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.tensor_parallel import random
    from megatron.core.utils import GlobalMemoryBuffer

    _replace(GlobalMemoryBuffer, "get_tensor", _global_buffer_get_tensor)
    _replace(RotaryEmbedding, "get_emb", _rotary_get_emb)
    # --recompute-granularity: megatron's checkpoint saves and restores the RNG states around the recomputation
    _replace(random, "_get_all_rng_states", _get_rng_states)
    _replace(random, "_set_all_rng_states", _set_rng_states)


def applied() -> bool:
    """Whether this process installed the CPU patches."""
    from megatron.core.utils import GlobalMemoryBuffer

    return bool(getattr(GlobalMemoryBuffer.get_tensor, _MARK, False))
