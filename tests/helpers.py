"""Small helpers shared by test modules."""

from __future__ import annotations

import dataclasses

import numpy as np

from artifacts import Sample


def float32_list(values: list[float]) -> list[float]:
    """Python floats holding exact float32 values, as ``tensor.tolist()`` returns them."""
    return np.asarray(values, dtype=np.float32).tolist()


def make_sample(index: int = 0, n: int = 4, vocab: int = 50_000, **changes: object) -> Sample:
    """A valid sample with `n` response tokens drawn from `vocab` (seeded by `index`); `changes` override fields."""
    rng = np.random.default_rng(index)
    sample = Sample(
        rollout_id=7,
        group_index=index // 2,
        sample_index=index,
        prompt=f"What is {index} + 1?",
        prompt_tokens=list(range(10, 20)),
        response="x" * n,
        response_tokens=rng.integers(0, vocab, n).tolist(),
        response_length=n,
        label=str(index + 1),
        reward=float(index % 2),
        status="completed",
        loss_mask=[1] * n,
        rollout_log_probs=float32_list((-rng.random(n) * 5).tolist()),
        weight_version=3,
        seed=1234 + index,
        metadata={"source": "tiny-arith", "turn": index},
    )
    return dataclasses.replace(sample, **changes)
