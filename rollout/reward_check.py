"""`rollflow run --dry-run`'s reward check: the run's reward called on a few rows of its data, each answered by
its own label written the way the rule reads an answer (`rewards.probe_response`), so that a reward that
raises, or returns NaN, text or None, is named in seconds rather than after the engines and trainers start."""

from __future__ import annotations

import asyncio
from typing import Any

from rollout.data import PromptSet
from rollout.rewards import RewardValueError, Scorer, probe_response, sample_rule
from rollout.sample import Sample
from rollout.scoring import score_samples

ROWS = 4  # enough to meet a second label format, few enough for a remote or LLM judge


def check_reward(
    scorer: Scorer, prompts: PromptSet, flag: str, tokenizer: Any, rm_type: str | None, group_rm: bool
) -> str:
    """One line with the rewards of the first `ROWS` rows of `prompts` (read with `flag`); ValueError naming the
    reward, the row, its label and response, and what the reward raised or returned, at the first row that does
    not give a finite number. `rm_type` is the built-in rule (None for a custom reward, which gets the label as
    its response)."""
    unit = "line" if prompts.path.endswith(".jsonl") else "row"
    rewards = []
    for i, p in enumerate(prompts.prompts[:ROWS]):
        response = probe_response(rm_type and sample_rule(p.metadata, rm_type), p.label)
        where = (
            f"{flag} {prompts.path} {unit} {p.row} (label {str(p.label)[:60]!r}, response {response[:80]!r})"
        )
        reward = asyncio.run(_score(scorer, _sample(i, p, response, tokenizer), group_rm))
        if isinstance(reward, str):
            raise ValueError(f"{where}: {reward}")
        rewards.append(reward)
    line = (
        f"reward check: {scorer.name} on {len(rewards)} {unit}{'s' * (len(rewards) != 1)} of {flag}, each answered by "
        "its label: "
        f"{', '.join(f'{r:g}' for r in rewards)}"
    )
    if rm_type and rm_type.removeprefix("boxed_") != "random" and rewards and max(rewards) <= 0:
        line += (
            f" (the labels themselves never scored above 0: is --rm-type {rm_type} the rule for this data?)"
        )
    return line


async def _score(scorer: Scorer, sample: Sample, group_rm: bool) -> float | str:
    """The sample's reward as the run scores it (rollout.scoring), or what went wrong."""
    try:
        [scored] = await score_samples(scorer, [sample], group_rm)
    except RewardValueError as e:
        return f"reward {scorer.name} returned {e.returned}, expected a finite number"
    except ValueError as e:
        return str(e)
    if scored.error is not None:
        return f"reward {scorer.name} raised {scored.error}"
    return scored.reward


def _sample(i: int, prompt: Any, response: str, tokenizer: Any) -> Sample:
    """The completed sample a run would score for `prompt` had the model answered `response`."""
    try:
        tokens = list(tokenizer.encode(response, add_special_tokens=False))
    except Exception:  # a vocabulary without an unknown token cannot spell every text
        tokens = []  # the reward then sees no response tokens, only the text
    return Sample(
        group_index=i,
        index=i,
        prompt=prompt.text,
        tokens=list(prompt.tokens) + tokens,
        response=response,
        response_length=len(tokens),
        loss_mask=[1] * len(tokens),
        label=prompt.label,
        metadata=dict(prompt.metadata),
        status=Sample.Status.COMPLETED,
    )


def check_run_reward(cfg: Any, source: Any) -> str:
    """`check_reward` for a resolved run config and its `rollout.source.RolloutSource`: the training data with
    the training reward, else the first eval set with the eval reward."""
    if source.train is not None:
        prompts, flag, scorer = source.train, "--prompt-data", source.scorer
    elif source.evals:
        name, prompts = source.evals[0]
        flag, scorer = f"--eval-prompt-data {name}", source.eval_scorer
    else:
        return "reward check: no prompt data to call the reward on"
    rm_type = scorer.name if scorer.builtin else None
    return check_reward(scorer, prompts, flag, source.tokenizer, rm_type, cfg.reward.group_rm)
