"""slime's plug-in points that are not the reward: which loss the trainer minimises (--loss-type,
--custom-loss-function-path)."""

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
