"""Activation checkpointing (slime / Megatron's --recompute-granularity, --recompute-method,
--recompute-num-layers) for the torch trainer's decoder layers.

Which layers: `recomputed_layers`, Megatron's rule: full + uniform recomputes every layer, full + block the
first N, selective every layer's attention only. Megatron's uniform keeps one input per chunk of N layers; HF
runs its layers one call at a time, so here every recomputed layer keeps its own input (N only sizes the
chunks Megatron would use: the same layers are recomputed, a little more memory is kept). Recomputation
reruns the same float operations on the same inputs, so the gradients are those without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def recomputed_layers(
    granularity: str | None, method: str | None, num_layers: int | None, total: int
) -> set[int]:
    """Indices of the decoder layers whose activations are recomputed in the backward."""
    if granularity is None:
        return set()
    if granularity == "full" and method == "block":
        return set(range(min(num_layers or 0, total)))
    return set(range(total))


def recompute(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` whose activations are recomputed in the backward (non-reentrant checkpoint: it
    takes keyword arguments and any output structure; no RNG is drawn, dropout being 0)."""
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


def apply_to_hf(model: Any, granularity: str | None, method: str | None, num_layers: int | None) -> set[int]:
    """Turn recomputation on in an HF decoder's own layers (`model.model.layers`): full = the whole layer (HF's
    gradient-checkpointing hook of the layer), selective = its self-attention module. Returns the layers."""
    if granularity is None:
        return set()
    layers = model.model.layers
    chosen = recomputed_layers(granularity, method, num_layers, len(layers))
    for i in sorted(chosen):
        layer = layers[i]
        if granularity == "full":
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = functools.partial(
                checkpoint, use_reentrant=False, preserve_rng_state=False
            )
        else:
            attn = layer.self_attn
            attn.forward = functools.partial(recompute, type(attn).forward.__get__(attn))
    return chosen


def is_hf_decoder(model: Any) -> bool:
    """Whether `model` has the `model.layers` list `apply_to_hf` works on."""
    inner = getattr(model, "model", None)
    return isinstance(getattr(inner, "layers", None), torch.nn.ModuleList)
