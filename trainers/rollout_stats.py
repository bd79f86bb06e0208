"""Trainer-side rollout stats (slime's `rollout/*` from the trainer): pure functions over samples and
log-prob rows, computed where the rows live (the trainer rank that wrote them)."""

from __future__ import annotations

from typing import Any

from artifacts.schema import Sample


def mean(xs: list[float]) -> float:
    """Arithmetic mean; 0.0 for no values (a metric of an empty selection)."""
    return float(sum(xs) / len(xs)) if xs else 0.0


def _masked_mean(values: list[float], mask: list[int]) -> float:
    kept = [v for v, m in zip(values, mask, strict=False) if m]
    return mean(kept)


def logprob_stats(samples: list[Sample], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Trainer-side rollout stats: per-sample loss-mask means, averaged over samples."""
    by_index = {r["sample_index"]: r for r in rows}
    out: dict[str, list[float]] = {}
    for s in samples:
        r = by_index[s.sample_index]
        for key in ("log_probs", "ref_log_probs", "entropy"):
            if r.get(key) is not None:
                out.setdefault(f"rollout/{key}", []).append(_masked_mean(r[key], s.loss_mask))
        if len(s.rollout_log_probs) == s.response_length:
            out.setdefault("rollout/rollout_log_probs", []).append(
                _masked_mean(s.rollout_log_probs, s.loss_mask)
            )
    return {k: mean(v) for k, v in out.items()}
