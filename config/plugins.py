"""slime's plug-in points that are not the reward or the generation: which loss the trainer minimises (--loss-type,
--custom-loss-function-path), and how a rollout's groups are drawn and kept (dynamic sampling)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from config.base import Section


class LossConfig(Section):
    """Which loss the trainer minimises (slime's --loss-type); the policy loss's own knobs are in TrainConfig."""

    loss_type: Literal["policy_loss", "sft_loss", "custom_loss"] = Field(
        "policy_loss",
        description="policy_loss: the RL loss of --policy-loss, --entropy-coef and --use-kl-loss; sft_loss: the "
        "negative log-likelihood of the response tokens (loss mask applied); custom_loss: the function of "
        "--custom-loss-function-path. slime's value_loss (a critic) is not offered: rollflow trains no critic.",
    )
    custom_loss_function_path: str | None = Field(
        None,
        description="Dotted path module.fn of the loss used with --loss-type custom_loss, called as slime calls "
        "it: fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics) (see trainers/custom_loss.py for "
        "the batch keys and rollflow's logits layout).",
    )

    @model_validator(mode="after")
    def _path_with_type(self) -> LossConfig:
        if self.loss_type == "custom_loss" and not self.custom_loss_function_path:
            raise ValueError("--loss-type custom_loss needs --custom-loss-function-path module.fn")
        if self.custom_loss_function_path and self.loss_type != "custom_loss":
            raise ValueError(
                f"--custom-loss-function-path is set but --loss-type is {self.loss_type}: "
                "add --loss-type custom_loss to train with it"
            )
        return self


class SamplingConfig(Section):
    """slime's dynamic sampling (DAPO) and its buffer flags: how the groups of a rollout are drawn and kept."""

    over_sampling_batch_size: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Prompt groups per draw (draws repeat until --rollout-batch-size groups pass "
        "--dynamic-sampling-filter-path; the surplus of the last draw is discarded, as in slime); None = "
        "--rollout-batch-size.",
    )
    dynamic_sampling_filter_path: str | None = Field(
        None,
        description="Dotted path of a group filter, called as slime calls it: fn(args, samples) -> "
        "DynamicFilterOutput(keep, reason) or a bool (rollout/dynamic.py); slime's "
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std[_with_fallback] name "
        "rollflow's own.",
    )
    buffer_filter_path: str | None = Field(
        None,
        description="Dotted path of slime's buffer filter, buffer_filter(args, rollout_id, buffer, num_samples) -> "
        "groups: which groups a --rollout-function-path's data_source.get_samples takes back from the buffer its "
        "data_source.add_samples filled (default: the first ones). The buffer lasts one rollout (slime's lasts the "
        "run): each rollout depends only on its seeds and id. Needs --rollout-function-path.",
    )
