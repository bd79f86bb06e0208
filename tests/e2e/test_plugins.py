"""slime's plug-ins end to end on the tiny recipe: each example in examples/ runs in a real flow."""

from __future__ import annotations

import asyncio
import math

import pytest

from artifacts.store import RunPaths, read_metrics, read_rollout
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


def test_dapo_filter_example_fills_each_rollout_and_replays_bitwise(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """Dynamic sampling in a real run: every rollout holds --rollout-batch-size groups that passed the example's
    filter, the draws are logged, and a replay of a rollout's generation keeps the same groups."""
    from flows.replay import replay_flow
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        eval={"eval_interval": None},
        train={"lr": 1e-4},  # small_config's 1e-2 makes the tiny model answer past the length limit
        sampling={
            "over_sampling_batch_size": 6,
            "dynamic_sampling_filter_path": "examples.dapo_filter.filters.mixed_and_finished",
        },
    )
    asyncio.run(run_flow(cfg))
    paths = RunPaths(cfg.resolved_run_dir)
    logged: dict[int, dict] = {}
    for record in read_metrics(paths.metrics):
        if record["kind"] == "rollout":
            logged.setdefault(record["rollout_id"], {}).update(record["metrics"])
    for rollout_id in (0, 1):
        rows = read_rollout(paths.rollout(rollout_id))
        assert [r.group_index for r in rows] == [g for g in range(4) for _ in range(4)]
        assert all(len({r.reward for r in rows[g * 4 : g * 4 + 4]}) > 1 for g in range(4))
        m = logged[rollout_id]
        assert m["rollout/dynamic_sampling/kept_groups"] == 4
        assert m["rollout/dynamic_sampling/drawn_groups"] == 6 * m["rollout/dynamic_sampling/draws"]
    result = asyncio.run(replay_flow(str(cfg.resolved_run_dir), 1, "generate"))
    assert result["identical"], result["difference"]


def test_buffer_filter_example_retries_groups_through_the_buffer(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """The example rollout function gives groups without a reward spread back to the buffer and the example
    buffer filter serves them again: every group of the rollout has a spread or used all its tries."""
    from examples.buffer_filter.retry import RETRIES
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        eval={"eval_interval": None},
        checkpoint={"save": None, "save_interval": None},
        rollout={"num_rollout": 1, "rollout_function_path": "examples.buffer_filter.retry.generate_rollout"},
        sampling={"buffer_filter_path": "examples.buffer_filter.retry.fewest_tries_first"},
    )
    asyncio.run(run_flow(cfg))
    rows = read_rollout(RunPaths(cfg.resolved_run_dir).rollout(0))
    assert [r.sample_index for r in rows] == list(range(16))
    for g in range(4):
        group = rows[g * 4 : g * 4 + 4]
        tries = {r.metadata.get("tries", 1) for r in group}
        assert len(tries) == 1 and (len({r.reward for r in group}) > 1 or tries == {RETRIES + 1})
