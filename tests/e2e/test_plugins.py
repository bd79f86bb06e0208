"""slime's plug-ins end to end on the tiny recipe: each example in examples/ runs in a real flow."""

from __future__ import annotations

import asyncio
import math

import pytest

from artifacts.store import RunPaths, read_metrics
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e

CISPO = "examples.custom_loss.cispo.cispo_loss"


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_custom_loss_example_trains_on_each_backend(
    tmp_path, ray_session, prefect_server, base_checkpoint, backend
):
    """The trainer ranks import the plug-in, every optimizer step is its loss (its own metric is logged) and
    moves the weights."""
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        eval={"eval_interval": None},
        checkpoint={"save": None, "save_interval": None},
        train={"train_backend": backend},
        loss={"loss_type": "custom_loss", "custom_loss_function_path": CISPO},
    )
    asyncio.run(run_flow(cfg))
    steps = [
        r["metrics"] for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == "step"
    ]
    assert len(steps) == 4  # 2 rollouts x 16 samples / 8 a step
    for m in steps:
        assert {"train/loss", "train/pg_loss", "train/ppo_kl", "train/cispo_clipfrac"} <= set(m)
        assert "train/entropy_loss" not in m  # the policy loss did not run
        assert all(math.isfinite(v) for v in m.values())
    # a rollout's first step that had a gradient moved the weights its second step is trained on
    moved = [
        second["train/ppo_kl"] != 0
        for first, second in zip(steps[0::2], steps[1::2], strict=True)
        if first["train/grad_norm"] > 0
    ]
    assert moved and all(moved)
