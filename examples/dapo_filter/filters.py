"""A DAPO dynamic sampling filter written as a slime user writes one (`--dynamic-sampling-filter-path`).

A group whose responses all got the same reward has zero advantage under GRPO and teaches nothing; DAPO draws more
prompt groups (`--over-sampling-batch-size`) and keeps only groups with a reward spread. This one also drops a
group in which every response ran into the length limit, whose rewards say more about the limit than the policy.

Run it on the tiny recipe (from the repository root, so `examples` is importable):

    rollflow run --rollout-batch-size 4 --over-sampling-batch-size 6 \
        --dynamic-sampling-filter-path examples.dapo_filter.filters.mixed_and_finished

slime's own `slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std` works as it is: rollflow
maps it to rollout.dynamic.check_reward_nonzero_std. The rollout's metrics count what was drawn and dropped:
rollout/dynamic_sampling/{draws,drawn_groups,dropped_groups,kept_groups} and rollout/dynamic_filter/drop_<reason>.
"""

from __future__ import annotations

from typing import Any

from rollout.dynamic import DynamicFilterOutput, check_reward_nonzero_std
from rollout.sample import Sample


def mixed_and_finished(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group whose rewards differ and in which some response finished before the length limit."""
    if all(s.status == Sample.Status.TRUNCATED for s in samples):
        return DynamicFilterOutput(keep=False, reason="all_truncated")
    return check_reward_nonzero_std(args, samples, **kwargs)
