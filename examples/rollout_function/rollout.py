"""A minimal slime --rollout-function-path: the whole rollout's generation in one function, with slime's
signature, on the tiny-arith recipe.

    rollflow run --rollout-function-path examples.rollout_function.rollout.generate_rollout

It takes the rollout's prompt groups from the data source, generates and scores every sample through
rollflow's `generate_and_rm` (the run's --custom-generate-function-path when set, else one engine call), and
returns the groups. A group whose samples all scored the same is generated once more (up to `RETRIES` times,
each try with fresh seeds derived from the first), so fewer groups reach the trainer with no learning signal;
the try count is kept in each sample's metadata. The function is sync, as slime's, and waits for async work with
`rollout.engine_client.run`.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from rollout.engine_client import run
from rollout.plugins import generate_and_rm, sampling_params_of
from rollout.sample import Sample

RETRIES = 1


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Sample]]:
    """slime's rollout function: `args.rollout_batch_size` groups of `args.n_samples_per_prompt` scored samples."""
    groups = data_source.get_samples(args.rollout_batch_size)
    return [run(_group(args, g)) for g in groups]


async def _group(args: Any, group: list[Sample]) -> list[Sample]:
    params = sampling_params_of(args)
    pending = list(group)
    for attempt in range(RETRIES + 1):
        done = await asyncio.gather(
            *(generate_and_rm(args, _retry(s, attempt), dict(params)) for s in pending)
        )
        if len({s.reward for s in done}) > 1 or attempt == RETRIES:
            return list(done)
    raise AssertionError("unreachable")


def _retry(sample: Sample, attempt: int) -> Sample:
    """A pending copy of `sample` for try `attempt` (try 0 keeps its seed, a retry draws a seed of its own)."""
    fresh = copy.deepcopy(sample)
    fresh.metadata["tries"] = attempt + 1
    if attempt and fresh.seed is not None:
        fresh.seed = (fresh.seed * 1_000_003 + attempt) % (1 << 63)
    return fresh
