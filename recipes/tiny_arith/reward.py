"""Exact-match reward for tiny-arith.

Contract: ``reward(response, label)`` is 1.0 iff the response, after stripping
surrounding whitespace and any trailing ``<eos>``/``<pad>`` tokens, equals ``label``
exactly; otherwise 0.0. Text after an ``<eos>`` that is not trailing (e.g.
``"68<eos>1"``) is *not* forgiven: rollouts are expected to stop at ``<eos>``.
"""

from __future__ import annotations

from collections.abc import Sequence

from recipes.common import clean_response as _clean


def reward(response: str, label: str) -> float:
    """1.0 if the cleaned response equals ``label`` exactly, else 0.0."""
    return 1.0 if _clean(response) == label.strip() else 0.0


def accuracy(responses: Sequence[str], labels: Sequence[str]) -> float:
    """Mean reward; 0.0 for empty input. Lengths must match."""
    if len(responses) != len(labels):
        raise ValueError(f"{len(responses)} responses but {len(labels)} labels")
    if not responses:
        return 0.0
    return sum(reward(r, y) for r, y in zip(responses, labels, strict=True)) / len(responses)
