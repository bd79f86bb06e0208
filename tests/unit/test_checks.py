"""The --ci-test checkers as pure functions (tolerances at their boundaries)."""

from __future__ import annotations

import pytest

from config import RunConfig
from tasks.checks import (
    CheckFailed,
    EngineWeights,
    kl_checker,
    logprob_checker,
    metric_gate,
    out_of_sync_message,
    raise_if_any,
    weight_update_failure,
)


def test_kl_checker_bounds():
    ok = [{"train/step": 0, "train/ppo_kl": 9e-10, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.0}]
    assert kl_checker(ok, 0, first_step_of_run=0) == []
    bad = [{"train/step": 0, "train/ppo_kl": 1e-9, "train/pg_clipfrac": 1e-10, "train/kl_loss": 1e-9}]
    assert [v.metric for v in kl_checker(bad, 0, first_step_of_run=0)] == [
        "train/ppo_kl",
        "train/pg_clipfrac",
        "train/kl_loss",
    ]
    later = [{"train/step": 4, "train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.5}]
    assert kl_checker(later, 2, first_step_of_run=0) == []  # kl_loss only at the run's first step
    # --use-rollout-logprobs: old log-probs are the engine's, so only kl_loss is checked
    assert [v.metric for v in kl_checker(bad, 0, first_step_of_run=0, recomputed_old=False)] == [
        "train/kl_loss"
    ]


def test_logprob_checker_bounds():
    stats = {
        "rollout/log_probs": -0.5,
        "rollout/ref_log_probs": -0.5,
        "rollout/rollout_log_probs": -0.52,
        "rollout/entropy": 0.6,
    }
    assert logprob_checker(stats, 0, True, 0.03, 0.7) == []
    assert [v.metric for v in logprob_checker({**stats, "rollout/entropy": 0.7}, 3, False, 0.03, 0.7)] == [
        "rollout/entropy"
    ]
    assert len(logprob_checker({**stats, "rollout/rollout_log_probs": -0.6}, 3, False, 0.03, 0.7)) == 1
    assert len(logprob_checker({**stats, "rollout/ref_log_probs": -0.50001}, 0, True, 0.03, 0.7)) == 1


def test_metric_gate_rules():
    cfg = RunConfig.model_validate(
        {"ci": {"ci_metric_checker_key": "eval/x", "ci_metric_checker_threshold": 0.5}}
    )
    evals = [{"rollout_id": 0, "metrics": {"eval/x": 0.2}}, {"rollout_id": 5, "metrics": {"eval/x": 0.5}}]
    assert metric_gate(cfg, evals) == []  # inclusive, any eval
    assert metric_gate(cfg, []) and "no eval ran" in str(metric_gate(cfg, [])[0])
    exact = RunConfig.model_validate(
        {
            "ci": {
                "ci_metric_checker_key": "eval/x",
                "ci_metric_checker_threshold": 0.5,
                "ci_metric_checker_expect_num": 2,
            }
        }
    )
    assert metric_gate(exact, evals)  # exactly 2 evals, but the first is below the threshold
    with pytest.raises(CheckFailed, match=r"\[metric checker\]"):
        raise_if_any(metric_gate(exact, evals))


def test_the_weight_update_failure_lists_every_differing_tensor_by_layer():
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(12)] + [
        "model.layers.3.mlp.down_proj.weight",
        "model.norm.weight",
    ]
    message = weight_update_failure(1, names)
    assert message.startswith(
        "[weight-update checker] engine 1: 14 tensor(s) differ from the trainer's after the "
        "first sync (tolerance: bitwise equal), in 13 layer group(s): layer_0000: "
    )
    for name in names:  # all of them, not the first 8
        assert name in message
    assert (
        "layer_0003: model.layers.3.mlp.down_proj.weight, model.layers.3.mlp.up_proj.weight; layer_0004"
        in message
    )
    assert message.endswith("layer_0011: model.layers.11.mlp.up_proj.weight; non_layer: model.norm.weight")


def test_the_engines_in_sync_failure_names_both_hashes_and_the_first_differing_tensor():
    trainer = {
        "model.embed_tokens.weight": "e",
        "model.layers.0.mlp.up_proj.weight": "a",
        "model.layers.1.mlp.up_proj.weight": "b",
    }
    engine = {**trainer, "model.layers.0.mlp.up_proj.weight": "x", "model.layers.1.mlp.up_proj.weight": "y"}
    sha_t, sha_e = "1" * 64, "2" * 64
    message = out_of_sync_message(0, 1, sha_t, [EngineWeights(0, 1, sha_e, engine)], trainer)
    assert message.startswith(
        "rollout 0: engines [0] do not hold the trainer's weights after the sync: engine 0: "
        "holds weight version 1 as expected"
    )
    assert f"but its weights hash to {sha_e}, the trainer's to {sha_t}" in message
    assert (
        "first differing tensor model.layers.0.mlp.up_proj.weight; 2 tensor(s) differ: layer_0000: "
        in message
    )
    assert "layer_0001: model.layers.1.mlp.up_proj.weight" in message
    stale = out_of_sync_message(3, 4, sha_t, [EngineWeights(1, 3, sha_t)], None)
    assert "engine 1: holds weight version 3 (expected 4: the sync did not reach it)" in stale
    assert "hash to" not in stale  # same content: only the version is wrong


def test_an_engine_still_holding_the_weights_of_before_the_sync_is_named_stale():
    before, trainer = "0" * 64, "1" * 64
    message = out_of_sync_message(
        4, 5, trainer, [EngineWeights(1, 5, before), EngineWeights(2, 5, "2" * 64)], None, before, "/runs/r"
    )
    assert message.startswith(
        "rollout 4: engines [1, 2] do not hold the trainer's weights after the sync: engine 1: stale: holds the "
        "weights of version 4 (a transfer that did not apply; it reports version 5); engine 2: holds weight "
        f"version 5 as expected but its weights hash to {'2' * 64}, the trainer's to {trainer}; confirm: "
        "rollflow replay /runs/r --rollout-id 4 --task sync pushes"
    )
    assert "--check-weight-update-equal" not in message  # it passes for a transfer that is dropped later
