"""The --ci-test checkers as pure functions (tolerances at their boundaries)."""

from __future__ import annotations

import pytest

from flows.config import RunConfig
from tasks.checks import CheckFailed, kl_checker, logprob_checker, metric_gate, raise_if_any


def test_kl_checker_bounds():
    ok = [{"train/step": 0, "train/ppo_kl": 9e-10, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.0}]
    assert kl_checker(ok, 0, first_step_of_run=0) == []
    bad = [{"train/step": 0, "train/ppo_kl": 1e-9, "train/pg_clipfrac": 1e-10, "train/kl_loss": 1e-9}]
    assert [v.metric for v in kl_checker(bad, 0, first_step_of_run=0)] == \
        ["train/ppo_kl", "train/pg_clipfrac", "train/kl_loss"]
    later = [{"train/step": 4, "train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.5}]
    assert kl_checker(later, 2, first_step_of_run=0) == []  # kl_loss only at the run's first step
    # --use-rollout-logprobs: old log-probs are the engine's, so only kl_loss is checked
    assert [v.metric for v in kl_checker(bad, 0, first_step_of_run=0, recomputed_old=False)] == ["train/kl_loss"]


def test_logprob_checker_bounds():
    stats = {"rollout/log_probs": -0.5, "rollout/ref_log_probs": -0.5, "rollout/rollout_log_probs": -0.52,
             "rollout/entropy": 0.6}
    assert logprob_checker(stats, 0, True, 0.03, 0.7) == []
    assert [v.metric for v in logprob_checker({**stats, "rollout/entropy": 0.7}, 3, False, 0.03, 0.7)] == \
        ["rollout/entropy"]
    assert len(logprob_checker({**stats, "rollout/rollout_log_probs": -0.6}, 3, False, 0.03, 0.7)) == 1
    assert len(logprob_checker({**stats, "rollout/ref_log_probs": -0.50001}, 0, True, 0.03, 0.7)) == 1


def test_metric_gate_rules():
    cfg = RunConfig.model_validate({"ci": {"ci_metric_checker_key": "eval/x", "ci_metric_checker_threshold": 0.5}})
    evals = [{"rollout_id": 0, "metrics": {"eval/x": 0.2}}, {"rollout_id": 5, "metrics": {"eval/x": 0.5}}]
    assert metric_gate(cfg, evals) == []  # inclusive, any eval
    assert metric_gate(cfg, []) and "no eval ran" in str(metric_gate(cfg, [])[0])
    exact = RunConfig.model_validate({"ci": {"ci_metric_checker_key": "eval/x", "ci_metric_checker_threshold": 0.5,
                                             "ci_metric_checker_expect_num": 2}})
    assert metric_gate(exact, evals)  # exactly 2 evals, but the first is below the threshold
    with pytest.raises(CheckFailed, match=r"\[metric checker\]"):
        raise_if_any(metric_gate(exact, evals))
