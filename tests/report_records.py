"""Metric records shaped as a run logs them, for tests of the run report, the console and the run page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config import RunConfig
from flows.report import RunReport


def records_of(rollout_id: int, reward: float, eval_value: float | None = None) -> list[dict[str, Any]]:
    """What one rollout flow logs: rollout stats (two records: save-rollout, log-prob), two optimizer steps, perf,
    check, and an eval of the weights after it (`eval_value`)."""
    out: list[dict[str, Any]] = [
        {"kind": "perf", "rollout_id": rollout_id, "metrics": {"perf/rollout_time": 0.1}},
        {
            "kind": "rollout",
            "rollout_id": rollout_id,
            "metrics": {"rollout/raw_reward": reward, "rollout/response_lengths": 4.25},
        },
        {"kind": "rollout", "rollout_id": rollout_id, "metrics": {"rollout/entropy": 0.5}},
        {
            "kind": "step",
            "rollout_id": rollout_id,
            "step": 2 * rollout_id,
            "metrics": {"train/ppo_kl": 0.0, "train/grad_norm": 4.0},
        },
        {
            "kind": "step",
            "rollout_id": rollout_id,
            "step": 2 * rollout_id + 1,
            "metrics": {"train/ppo_kl": 0.002, "train/grad_norm": 6.0},
        },
        {
            "kind": "check",
            "rollout_id": rollout_id,
            "metrics": {
                "check/finite_metrics": 1.0,
                "check/engines_in_sync": 1.0,
                "check/weight_version": rollout_id + 1,
            },
        },
    ]
    if eval_value is not None:
        out.append(
            {
                "kind": "eval",
                "rollout_id": rollout_id + 1,
                "metrics": {
                    "eval/tiny-arith": eval_value,
                    "eval/tiny-arith-truncated_ratio": 0.0,
                    "eval/step": rollout_id + 1,
                },
            }
        )
    return out


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report_of(
    tmp_path: Path,
    rollouts: int,
    total: int,
    evals: dict[int, float],
    clock: Clock | None = None,
    first_eval: float | None = 0.4,
    **config: Any,
) -> RunReport:
    """A report after `rollouts` rollouts of 2 s each (of `total`), with an eval of the starting weights
    (`first_eval`, None: none) and after each rollout in `evals` ({rollout id: value}); rewards rise by 0.01 per
    rollout."""
    cfg = RunConfig.model_validate(
        {"name": "t", "run_dir": str(tmp_path / "run"), "rollout": {"num_rollout": total}, **config}
    )
    clock = clock or Clock()
    report = RunReport(cfg, "run-1", 0, total, clock=clock)
    if first_eval is not None:
        report.records.append(
            {"kind": "eval", "rollout_id": 0, "metrics": {"eval/tiny-arith": first_eval, "eval/step": 0}}
        )
    for rid in range(rollouts):
        report.records.extend(records_of(rid, 0.3 + 0.01 * rid, evals.get(rid)))
        clock.now += 2.0
        report.rollout_done(rid, 2.0)
    return report
