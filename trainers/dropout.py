"""Dropout that a model's config.json turns on. RL trainers run without it (slime's launch lines pass
--attention-dropout 0.0 --hidden-dropout 0.0): with dropout the old-policy log-prob pass and the first train step
see different forwards, so the first step's ratio is not 1 and its KL not 0."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# a sequence-classification head's probability: a causal LM never applies it
_UNUSED = frozenset({"classifier_dropout"})


def dropout_keys(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """(key, probability) of every dropout above 0 in an HF config dict, nested sections (text_config) as
    `text_config.key`: keys naming dropout (attention_dropout, hidden_dropout, ...) or GPT-2's *_pdrop."""
    found: list[tuple[str, float]] = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += dropout_keys(value, f"{name}.")
        elif (
            isinstance(key, str)  # id2label's keys are ints
            and ("dropout" in key or key.endswith("pdrop"))
            and key not in _UNUSED
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and value > 0
        ):
            found.append((name, float(value)))
    return found


def describe(found: list[tuple[str, float]]) -> str:
    """`attention_dropout = 0.1, hidden_dropout = 0.1`."""
    return ", ".join(f"{key} = {value:g}" for key, value in found)
