"""`rollflow run --dry-run`'s reward check: the run's reward called on a few rows of its data. Each row is
answered by its own label, written the way the rule reads an answer (`rewards.probe_response`). So a reward
that raises, or returns NaN, text or None, is named in seconds, not after the engines and trainers start.
With `--group-rm` a custom reward is called once, on a group of --n-samples-per-prompt samples of the first row,
as the run calls it (`rollout.scoring.score_samples`). `probe_group` gives the same kind of scored group to the
dry run's plug-in checks (rollout/plugin_check.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from rollout.data import PromptSet
from rollout.rewards import RewardValueError, Scorer, probe_response, sample_rule
from rollout.sample import Sample, from_row
from rollout.scoring import package, score_samples

ROWS = 4  # enough to meet a second label format, few enough for a remote or LLM judge
# what a remote_rm probe may take without --rm-timeout: a few of slime's retries, not its ten (minutes)
REMOTE_SECONDS = 15.0


@dataclass(frozen=True)
class Probe:
    """Where the probe samples come from: the data, its flag and reward, and the reward's calling convention."""

    scorer: Scorer
    prompts: PromptSet
    flag: str
    tokenizer: Any
    rm_type: str | None  # the built-in rule (None for a custom reward, which gets the label as its response)
    group_rm: bool
    note: str = ""  # said after a failure: how the probe's call differs from the run's

    @property
    def unit(self) -> str:
        return "line" if self.prompts.path.endswith(".jsonl") else "row"


def check_reward(
    scorer: Scorer,
    prompts: PromptSet,
    flag: str,
    tokenizer: Any,
    rm_type: str | None,
    group_rm: bool,
    group_size: int = 1,
) -> str:
    """One line with the rewards of the first `ROWS` rows of `prompts` (read with `flag`), or with `group_rm` and a
    custom reward of one group of `group_size` samples of the first row; ValueError naming the reward, the row, its
    label and response, and what the reward raised or returned, at the first row that does not give a finite
    number. `rm_type` is the built-in rule (None for a custom reward, which gets the label as its response)."""
    return probe_reward(Probe(scorer, prompts, flag, tokenizer, rm_type, group_rm), group_size)


def probe_reward(probe: Probe, group_size: int = 1) -> str:
    """`check_reward` of a probe."""
    scorer, prompts, flag, rm_type, group_rm = (
        probe.scorer,
        probe.prompts,
        probe.flag,
        probe.rm_type,
        probe.group_rm,
    )
    if group_rm and not scorer.builtin:
        group, where = scored_group(probe, group_size)
        rewards = [float(s.reward) for s in group]  # type: ignore[arg-type]
        line = (
            f"reward check: {scorer.name} (--group-rm) called once on {where}, each answered by its label: "
        )
        return line + ", ".join(f"{r:g}" for r in rewards)
    rewards = []
    for i in range(min(ROWS, len(prompts.prompts))):
        [sample], _ = _scored(probe, i, 1)
        rewards.append(float(sample.reward))  # type: ignore[arg-type]
    unit = probe.unit
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


def scored_group(probe: Probe, size: int) -> tuple[list[Sample], str]:
    """`size` samples of the first row, each answered by its label, scored as the run scores a group and read back
    as the run's plug-ins see them (rollout rows made slime samples); and the words that say which group it is."""
    return _scored(probe, 0, size, group=True)


def _scored(probe: Probe, i: int, size: int, group: bool = False) -> tuple[list[Sample], str]:
    """Row `i` answered by its label `size` times (one group), scored; ValueError naming the row and the reward's
    fault when a sample gets no finite number."""
    p = probe.prompts.prompts[i]
    response = probe.rm_type and sample_rule(p.metadata, probe.rm_type)
    text = probe_response(response, p.label)
    where = (
        f"{probe.flag} {probe.prompts.path} {probe.unit} {p.row} (label {str(p.label)[:60]!r}, response "
        f"{text[:80]!r})"
    )
    if group:
        where = f"a group of {size} sample{'s' * (size != 1)} of {where}"
    samples = [_sample(i, i * size + j, p, text, probe.tokenizer) for j in range(size)]
    scored = asyncio.run(_score(probe.scorer, samples, probe.group_rm))
    if isinstance(scored, str):
        note = probe.note if "RemoteRewardError" in scored else ""
        name = f"--group-rm reward {probe.scorer.name}"
        if scored.startswith(name):  # the plug-in first, then the group it was called on
            raise ValueError(
                f"{name} called as reward(args, samples) on {where}: {scored.removeprefix(name + ' ')}{note}"
            )
        raise ValueError(f"{where}: {scored}{note}")
    rows = package(samples, scored, 0, [{} for _ in samples], weight_version=0)
    return [from_row(r) for r in rows], where


async def _score(scorer: Scorer, samples: list[Sample], group_rm: bool) -> list[Any] | str:
    """The samples' scores as the run scores them (rollout.scoring), or what went wrong."""
    name = f"--group-rm reward {scorer.name}" if group_rm and not scorer.builtin else f"reward {scorer.name}"
    try:
        scored = await score_samples(scorer, samples, group_rm)
    except RewardValueError as e:
        return f"{name} returned {e.returned}, expected a finite number"
    except ValueError as e:
        return str(e)
    for sc in scored:
        if sc.error is not None:
            return f"{name} raised {sc.error}"
    return scored


def _sample(group: int, index: int, prompt: Any, response: str, tokenizer: Any) -> Sample:
    """The completed sample a run would score for `prompt` had the model answered `response`."""
    try:
        tokens = list(tokenizer.encode(response, add_special_tokens=False))
    except Exception:  # a vocabulary without an unknown token cannot spell every text
        tokens = []  # the reward then sees no response tokens, only the text
    return Sample(
        group_index=group,
        index=index,
        prompt=prompt.text,
        tokens=list(prompt.tokens) + tokens,
        response=response,
        response_length=len(tokens),
        loss_mask=[1] * len(tokens),
        rollout_log_probs=[0.0] * len(tokens),
        label=prompt.label,
        metadata=dict(prompt.metadata),
        status=Sample.Status.COMPLETED,
        seed=index,
    )


def run_probe(cfg: Any, source: Any) -> Probe | None:
    """The probe of a resolved run config and its `rollout.source.RolloutSource`: the training data with the
    training reward, else the first eval set with the eval reward; None without prompt data."""
    if source.train is not None:
        prompts, flag, scorer = source.train, "--prompt-data", source.scorer
    elif source.evals:
        name, prompts = source.evals[0]
        flag, scorer = f"--eval-prompt-data {name}", source.eval_scorer
    else:
        return None
    rm_type = scorer.name if scorer.builtin else None
    note = ""
    if scorer.builtin and cfg.reward.rm_timeout is None:
        scorer = scorer.remote_bounded(REMOTE_SECONDS)
        note = (
            f" (a dry run waits {REMOTE_SECONDS:g} s for a remote_rm sample; a run waits as slime does, 120 s an "
            "attempt, up to 10 attempts, or --rm-timeout)"
        )
    group_rm = cfg.reward.group_rm and source.train is not None  # evals are scored sample by sample
    return Probe(scorer, prompts, flag, source.tokenizer, rm_type, group_rm, note)


def check_run_reward(cfg: Any, source: Any) -> str:
    """`check_reward` for a resolved run config and its `rollout.source.RolloutSource` (`run_probe`'s data)."""
    probe = run_probe(cfg, source)
    if probe is None:
        return "reward check: no prompt data to call the reward on"
    return probe_reward(probe, cfg.rollout.n_samples_per_prompt)
