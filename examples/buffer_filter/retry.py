"""slime's --buffer-filter-path with a --rollout-function-path that gives groups back, on the tiny-arith recipe.

    rollflow run --rollout-function-path examples.buffer_filter.retry.generate_rollout \
        --buffer-filter-path examples.buffer_filter.retry.fewest_tries_first

The rollout function generates one prompt group at a time. A group whose samples all scored the same (no GRPO
signal) goes back into the data source's buffer with fresh seeds (`data_source.add_samples`), up to `RETRIES`
times; `data_source.get_samples` then serves the buffer first, and the buffer filter decides which given-back group
is tried next: the one tried fewest times, so no group waits behind another's retries. Each sample's metadata keeps
its try count.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from rollout.engine_client import run
from rollout.plugins import generate_and_rm, sampling_params_of
from rollout.sample import Sample

RETRIES = 2


def fewest_tries_first(
    args: Any, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int
) -> list[list[Sample]]:
    """slime's buffer filter signature: take `num_samples` groups out of `buffer`, the least-tried first (ties in
    buffer order)."""
    order = sorted(range(len(buffer)), key=lambda i: (buffer[i][0].metadata.get("tries", 1), i))[:num_samples]
    taken = [buffer[i] for i in order]
    for i in sorted(order, reverse=True):
        del buffer[i]
    return taken


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Sample]]:
    """slime's rollout function: `args.rollout_batch_size` scored groups, retrying the ones without a reward spread."""
    finished: list[list[Sample]] = []
    while len(finished) < args.rollout_batch_size:
        (group,) = data_source.get_samples(1)
        done = run(_generate(args, group))
        tries = done[0].metadata.get("tries", 1)
        if len({s.reward for s in done}) > 1 or tries > RETRIES:
            finished.append(done)
        else:
            data_source.add_samples([[_retry(s, group[i], tries + 1) for i, s in enumerate(done)]])
    return finished


async def _generate(args: Any, group: list[Sample]) -> list[Sample]:
    params = sampling_params_of(args)
    return list(await asyncio.gather(*(generate_and_rm(args, copy.deepcopy(s), dict(params)) for s in group)))


def _retry(done: Sample, pending: Sample, tries: int) -> Sample:
    """The pending sample again (its prompt only), with try count `tries` and a seed of its own for that try."""
    fresh = copy.deepcopy(pending)
    fresh.metadata["tries"] = tries
    if done.seed is not None:
        fresh.seed = (done.seed * 1_000_003 + tries) % (1 << 63)
    return fresh
