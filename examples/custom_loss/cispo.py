"""CISPO (MiniMax-M1, 2025) as a `--loss-type custom_loss` plug-in: the importance weight of each token is clipped
and its gradient stopped, so every token keeps a gradient (PPO's clip zeroes the gradient of clipped tokens).

    loss = -sum_of_sample_mean( sg(min(ratio, 1 + eps_high)) * advantage * log_prob )

Run it on the tiny recipe (from the repository root, so `examples` is importable):

    rollflow run --loss-type custom_loss --custom-loss-function-path examples.custom_loss.cispo.cispo_loss

Written against slime's signature; the one rollflow-specific line is the import of get_log_probs_and_entropy
(slime's lives in slime.backends.megatron_utils.loss and reads slime's packed logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainers.custom_loss import get_log_probs_and_entropy


def cispo_loss(
    args: Any,
    batch: dict[str, Any],
    logits: torch.Tensor,
    sum_of_sample_mean: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO's loss and its metrics (pg_loss, ppo_kl, and cispo_clipfrac: the tokens whose weight was clipped)."""
    _, out = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
    )
    log_probs = torch.cat(out["log_probs"])
    old_log_probs = torch.cat(batch["log_probs"])
    advantages = torch.cat(batch["advantages"])
    eps_high = args.eps_clip_high if args.eps_clip_high is not None else args.eps_clip
    ratio = torch.exp(log_probs.detach() - old_log_probs)
    weight = ratio.clamp(max=1.0 + eps_high)
    loss = sum_of_sample_mean(-weight * advantages * log_probs)
    return loss, {
        "loss": loss.detach(),
        "pg_loss": loss.detach(),
        "ppo_kl": sum_of_sample_mean(old_log_probs - log_probs.detach()),
        "cispo_clipfrac": sum_of_sample_mean((ratio > 1.0 + eps_high).float()),
    }
