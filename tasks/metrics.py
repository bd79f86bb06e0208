"""Metric records: one line in metrics.jsonl, one slime-style console line (`rollout N: {...}`)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from artifacts.schema import Sample
from artifacts.store import RunPaths, append_metrics
from flows.config import RunConfig
from trainers.rollout_stats import mean as _mean


def log_metrics(cfg: RunConfig, kind: str, rollout_id: int, metrics: dict[str, Any], step: int | None = None) -> dict:
    """Append `{"kind", "rollout_id", "step"?, "metrics"}` to metrics.jsonl and print it as slime does."""
    record: dict[str, Any] = {"kind": kind, "rollout_id": rollout_id}
    if step is not None:
        record["step"] = step
    record["metrics"] = metrics
    append_metrics(RunPaths(cfg.resolved_run_dir).metrics, record)
    print(f"{kind} {step if kind == 'step' else rollout_id}: {metrics}", flush=True)
    return record


def reward_stats(samples: list[Sample], n_per_prompt: int) -> dict[str, float]:
    """Rollout-side stats of one rollout (reward, lengths, truncation, zero-std groups)."""
    lengths = [float(s.response_length) for s in samples]
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(s.reward)
    zero_std = sum(1 for g in groups.values() if len(set(g)) == 1)
    return {
        "rollout/raw_reward": _mean([s.reward for s in samples]),
        "rollout/response_lengths": _mean(lengths),
        "rollout/truncated": _mean([1.0 if s.status == "truncated" else 0.0 for s in samples]),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/zero_std/count": float(zero_std),
    }


def non_finite(metrics: dict[str, Any]) -> list[str]:
    """Names of the metrics that are NaN or infinite."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
