"""A group reward for slime's --group-rm: majority vote, which needs no label (test-time RL): each prompt
group's samples are scored together, 1.0 for a sample whose answer is the group's most common answer, else 0.0.

    rollflow run --group-rm --custom-rm-path examples.group_reward.majority.majority_vote

rollflow calls it once per prompt group as slime does, `reward(args, samples)`, and takes one reward per sample
back. A tie between answers is broken by the answer seen first, so a group's rewards depend only on the group.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rollout.sample import Sample


def answer(sample: Sample) -> str:
    """A sample's answer: its response without surrounding space (a truncated one has none)."""
    return "" if sample.status is Sample.Status.TRUNCATED else sample.response.strip()


async def majority_vote(args: Any, samples: list[Sample]) -> list[float]:
    """1.0 for the samples that give the group's most common non-empty answer, 0.0 for the others."""
    votes = Counter(a for a in map(answer, samples) if a)
    if not votes:
        return [0.0] * len(samples)
    top = max(votes.values())
    winner = next(a for a in map(answer, samples) if votes.get(a) == top)
    return [1.0 if answer(s) == winner else 0.0 for s in samples]
