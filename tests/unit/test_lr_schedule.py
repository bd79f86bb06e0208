"""The LR schedule every trainer backend shares."""

from __future__ import annotations

import math

import pytest

from trainers.lr_schedule import lr_lambda


def test_warmup_then_cosine_to_the_floor_and_flat_after():
    f = lr_lambda(lr=1e-3, min_lr=1e-4, warmup_iters=2, decay_style="cosine", total_steps=6)
    assert [f(0), f(1)] == [0.5, 1.0]  # (step + 1) / warmup
    assert f(2) == 1.0 and f(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(6) == pytest.approx(0.1) and f(60) == pytest.approx(0.1)


@pytest.mark.parametrize("style, middle", [("constant", 1.0), ("linear", 0.5)])
def test_constant_and_linear(style, middle):
    f = lr_lambda(lr=1.0, min_lr=0.0, warmup_iters=0, decay_style=style, total_steps=4)
    assert f(0) == 1.0 and f(2) == middle
