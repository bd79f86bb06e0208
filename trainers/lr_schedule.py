"""The learning-rate schedule every trainer backend steps with (a multiplier of the peak LR per optimizer
step, for `torch.optim.lr_scheduler.LambdaLR`)."""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_lambda(
    *, lr: float, min_lr: float, warmup_iters: int, decay_style: str, total_steps: int
) -> Callable[[int], float]:
    """Factor of step `s`: linear warm-up (s+1)/warmup over the first `warmup_iters` steps, then constant,
    linear or cosine decay from 1 to `min_lr / lr` at `total_steps` (and flat after it)."""
    floor = min_lr / lr

    def factor(step: int) -> float:
        if warmup_iters and step < warmup_iters:
            return (step + 1) / warmup_iters
        if decay_style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_iters) / max(1, total_steps - warmup_iters))
        decay = 1.0 - progress if decay_style == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return floor + (1.0 - floor) * decay

    return factor
