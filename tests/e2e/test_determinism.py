"""End to end: bitwise reproducibility, resume, DP topologies, the optimizer knife, model-hash checks."""

from __future__ import annotations

import asyncio
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from artifacts.store import RunPaths, read_metrics, read_rollout
from flows.diff import first_divergence
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def _run(cfg):
    from flows.run import run_flow

    return asyncio.run(run_flow(cfg))


def test_two_identical_runs_are_bitwise_identical(tmp_path, ray_session, prefect_server, base_checkpoint):
    """Two runs of one config: the samples, and so everything after them, are the same bytes, evals included."""
    a, b = (
        small_config(tmp_path / n, base_checkpoint, checkpoint={"save": str(tmp_path / n / "ckpt")})
        for n in ("a", "b")
    )
    _run(a)
    _run(b)
    assert first_divergence(a.resolved_run_dir, b.resolved_run_dir) is None
    for eval_id in range(3):  # evals 0, 1, 2: every eval's samples, not only their mean reward
        samples_a, samples_b = (
            read_rollout(RunPaths(c.resolved_run_dir).eval_rollout(eval_id)) for c in (a, b)
        )
        assert [(s.response_tokens, s.rollout_log_probs) for s in samples_a] == [
            (s.response_tokens, s.rollout_log_probs) for s in samples_b
        ]
    changed = small_config(
        tmp_path / "c",
        base_checkpoint,
        train={"lr": 2e-2},
        checkpoint={"save": str(tmp_path / "c" / "ckpt")},
    )
    _run(changed)
    diff = first_divergence(a.resolved_run_dir, changed.resolved_run_dir)
    assert diff is not None and diff.startswith("rollout 0 metrics")  # same samples, different training


def test_resume_after_exit_matches_an_uninterrupted_run(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    rollout = {"num_rollout": 6}
    full = small_config(
        tmp_path / "full",
        base_checkpoint,
        rollout=rollout,
        eval={"eval_interval": None},
        checkpoint={"save": str(tmp_path / "full" / "ckpt"), "ci_save_model_hash": True},
    )
    _run(full)
    ckpt = str(tmp_path / "cut" / "ckpt")
    first = small_config(
        tmp_path / "cut",
        base_checkpoint,
        rollout=rollout,
        eval={"eval_interval": None},
        checkpoint={"save": ckpt, "save_interval": 3, "ci_save_model_hash": True},
        debug={"debug_exit_after_rollout": 3},
    )
    _run(first)
    assert (tmp_path / "cut" / "ckpt" / "iter_0000002" / "model_hash_tp0_pp0_dp0_cp0.json").is_file()
    resumed = small_config(
        tmp_path / "cut",
        base_checkpoint,
        rollout=rollout,
        eval={"eval_interval": None},
        checkpoint={"save": ckpt, "load": ckpt, "ci_save_model_hash": True, "ci_check_model_hash": True},
    )
    _run(resumed)
    assert first_divergence(full.resolved_run_dir, resumed.resolved_run_dir) is None
    steps = [r for r in read_metrics(RunPaths(resumed.resolved_run_dir).metrics) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(12))


def test_planted_checkpoint_corruption_is_named_by_layer(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    ckpt = tmp_path / "ckpt"
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        checkpoint={"save": str(ckpt), "ci_save_model_hash": True},
    )
    _run(cfg)
    weights = load_file(str(ckpt / "iter_0000000" / "model.safetensors"))
    name = next(k for k in weights if ".layers.1." in k)
    weights[name] = weights[name] + 1e-3
    save_file(weights, str(ckpt / "iter_0000000" / "model.safetensors"))
    resumed = small_config(
        tmp_path / "r",
        base_checkpoint,
        rollout={"num_rollout": 2},
        eval={"eval_interval": None},
        checkpoint={"load": str(ckpt), "ci_check_model_hash": True},
    )
    # the content hashes name the tensor before anything starts; without them the model hashes name its layer
    with pytest.raises(
        ValueError, match=rf"model\.safetensors: tensor {re.escape(name)}: saved sha256 \w{{12}}, "
    ):
        _run(resumed)
    unchecked = resumed.model_copy(
        update={"checkpoint": resumed.checkpoint.model_copy(update={"no_verify_checkpoint": True})}
    )
    with pytest.raises(Exception, match=r"layer_0001"):
        _run(unchecked)


def test_dp1_two_micro_batches_equals_dp2_with_deterministic_collective(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    common = {"global_batch_size": 8, "micro_batch_size": 4}
    one = small_config(
        tmp_path / "dp1",
        base_checkpoint,
        eval={"eval_interval": None},
        train={**common, "data_parallel_size": 1},
        debug={"debug_deterministic_collective": True},
        checkpoint={"save": str(tmp_path / "dp1" / "ckpt")},
    )
    two = small_config(
        tmp_path / "dp2",
        base_checkpoint,
        eval={"eval_interval": None},
        train={**common, "data_parallel_size": 2},
        debug={"debug_deterministic_collective": True},
        checkpoint={"save": str(tmp_path / "dp2" / "ckpt")},
    )
    _run(one)
    _run(two)
    assert first_divergence(one.resolved_run_dir, two.resolved_run_dir) is None


def test_disable_optimizer_runs_forward_backward_but_never_moves_weights(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        debug={"debug_disable_optimizer": True},
    )
    _run(cfg)
    steps = [
        r["metrics"] for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == "step"
    ]
    assert len(steps) == 2 and all("train/grad_norm" in m and "train/lr-pg_0" not in m for m in steps)
    assert any(m["train/grad_norm"] > 0 for m in steps)
    base = load_file(f"{base_checkpoint}/model.safetensors")
    saved = load_file(str(tmp_path / "ckpt" / "iter_0000000" / "model.safetensors"))
    assert all(torch.equal(base[k], saved[k]) for k in base)


def test_slime_first_launch_and_ref_load_as_the_starting_weights(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """`--load D --save D` with D empty starts fresh (slime's first launch) and the next launch resumes; with no
    checkpoint under --load, --ref-load is where the trainer starts (slime's meaning)."""
    d = str(tmp_path / "ckpt")
    first = small_config(
        tmp_path / "one",
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        checkpoint={"save": d, "load": d},
    )
    _run(first)
    assert (tmp_path / "ckpt" / "iter_0000000" / "model.safetensors").is_file()
    again = small_config(
        tmp_path / "one",
        base_checkpoint,
        rollout={"num_rollout": 2},
        eval={"eval_interval": None},
        checkpoint={"save": d, "load": d},
    )
    _run(again)
    steps = [
        r["rollout_id"] for r in read_metrics(RunPaths(again.resolved_run_dir).metrics) if r["kind"] == "step"
    ]
    assert steps == [0, 0, 1, 1]  # the second launch trained rollout 1 only

    ref = tmp_path / "ref"
    ref.mkdir()
    for f in ("config.json", "model.safetensors"):
        (ref / f).write_bytes((tmp_path / "ckpt" / "iter_0000001" / f).read_bytes())
    frozen = small_config(
        tmp_path / "frozen",
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ref_load=str(ref),
        debug={"debug_disable_optimizer": True},
        checkpoint={"save": str(tmp_path / "frozen-ckpt"), "load": str(tmp_path / "empty")},
    )
    _run(frozen)
    saved = load_file(str(tmp_path / "frozen-ckpt" / "iter_0000000" / "model.safetensors"))
    start = load_file(str(ref / "model.safetensors"))
    assert all(torch.equal(saved[k], start[k]) for k in start)  # the weights never moved from --ref-load's
