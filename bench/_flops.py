"""The FLOP limit of this machine for a decoder's generation: what fraction of it a tokens/s figure is.

limit = the best fp32 matmul rate torch reaches here with the same thread count (a 1024^3 GEMM, best of a few);
work per generated token = 2 x (weights of every matmul, output layer included) + 4 x layers x attention
width x the mean context the token attends over (q.k and the weighted sum of v).
At a few rows a decode step is bound by reading the weights instead: `decode_products_seconds` times the weight
products of one step alone.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def matmul_peak_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """Best fp32 GEMM rate (GFLOP/s) of torch on this machine with `threads` threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        return 2 * n**3 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def flops_per_token(model: torch.nn.Module, mean_context: float) -> float:
    """FLOPs to generate one token with `model` (an HF causal LM) attending over `mean_context` positions."""
    cfg = model.config
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * mean_context
    return 2 * matmul + attention


def decode_products_seconds(fast: Any, rows: int, repeats: int = 5) -> float:
    """Best seconds of one pass of `rows` rows through every weight product of a decode step of the embedded
    engine's fast decoder (`FastWeights` `fast`: each layer's q|k|v, o, gate|up and down, then the output layer),
    with the engine's own kernels and layout and nothing else. Every matrix is a distinct tensor, as in a step, so
    the pass streams the weights from memory: no decode step of this engine, attention, norms and sampling left
    out, can be shorter."""
    matrices = [m for layer in fast.layers for m in (layer[1], layer[3], layer[5], layer[6])] + [fast.lm_head]
    inputs = {m.shape[1]: torch.randn(rows, m.shape[1]).to(fast.embed.dtype) for m in matrices}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass warms the kernels up
            start = time.perf_counter()
            for m in matrices:
                fast.linear(inputs[m.shape[1]], m)
            best = min(best, time.perf_counter() - start)
    return best
