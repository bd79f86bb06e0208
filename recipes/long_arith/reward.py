"""Reward for long-arith: exact final answer, else partial credit for the steps' fields.

Contract of ``reward(response, label)`` (``label`` is the reference ``solution``; trailing ``<eos>``/``<pad>`` and
surrounding whitespace of the response are ignored, as in tiny-arith):
    * 1.0 if the response's final part (after its last ``;``) equals the reference's (``=<sum>``);
    * else ``PARTIAL_CREDIT`` x the fraction of the reference's step fields (the two digits, the carry and the sum
      of each ``a+b+c=s`` step) that the response writes right, step by step at the same position, out of 4 x
      max(#response steps, #reference steps), so extra steps cost too; a step that is not ``a+b+c=s`` scores 0.
Why field-level partial credit: a warm-started model this small writes the format and about the right number of
steps long before it finds the right digits of 25-digit operands, so whole-step or final-answer credit would be
zero for every sample of a group (no GRPO signal); counting fields rewards each digit it gets right, and stays
below any correct answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from recipes.common import clean_response

PARTIAL_CREDIT = 0.5
_STEP = re.compile(r"(\d)\+(\d)\+(\d)=(\d+)")


def _parts(text: str) -> tuple[list[str], str]:
    *steps, final = text.split(";")
    return steps, final


def _fields_right(step: str, ref: str) -> int:
    got, want = _STEP.fullmatch(step), _STEP.fullmatch(ref)
    if got is None or want is None:
        return 0
    return sum(g == w for g, w in zip(got.groups(), want.groups(), strict=True))


def reward(response: str, label: str) -> float:
    """See the module doc."""
    steps, final = _parts(clean_response(response))
    ref_steps, ref_final = _parts(label.strip())
    if final == ref_final:
        return 1.0
    right = sum(_fields_right(s, r) for s, r in zip(steps, ref_steps, strict=False))
    return PARTIAL_CREDIT * right / (4 * max(len(steps), len(ref_steps), 1))


def mean_reward(responses: Sequence[str], labels: Sequence[str]) -> float:
    """Mean reward; 0.0 for empty input. Lengths must match."""
    if len(responses) != len(labels):
        raise ValueError(f"{len(responses)} responses but {len(labels)} labels")
    return (
        sum(reward(r, y) for r, y in zip(responses, labels, strict=True)) / len(responses)
        if responses
        else 0.0
    )
