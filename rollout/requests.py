"""The rollout function: prompts -> engine requests -> scored samples.

The `generate` and `eval` tasks call engines with what `build_requests` returns and hand the outputs to
`to_samples`. Seeds are derived per sample from (rollout_seed, rollout_id, sample_index), stored with the
sample, and reused by a replay.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from artifacts.schema import Sample as Row
from engines.base import GenerateOutput, GenerateRequest, SamplingParams
from rollout.data import Prompt
from rollout.rewards import Scorer
from rollout.sample import Sample
from rollout.scoring import finished_sample, package, score_samples
from rollout.template import Stops

EVAL_ID_OFFSET = 1 << 20  # eval sample seeds live apart from training ones


def sample_seed(rollout_seed: int, rollout_id: int, sample_index: int) -> int:
    """A stable 63-bit seed for one sample (independent of batch layout and process)."""
    digest = hashlib.sha256(f"{rollout_seed}:{rollout_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class Entry:
    """One sample to generate: the request and where its prompt came from."""

    request: GenerateRequest
    prompt: Prompt
    group_index: int
    sample_index: int
    dataset: str | None = None  # eval: the dataset's name


def build_requests(
    prompts: list[Prompt],
    rollout_seed: int,
    rollout_id: int,
    n_per_prompt: int,
    params: SamplingParams,
    *,
    eval_mode: bool = False,
    datasets: list[str] | None = None,
) -> list[Entry]:
    """`n_per_prompt` entries per prompt (a group), sample indices consecutive across groups."""
    seed_space = rollout_id + EVAL_ID_OFFSET if eval_mode else rollout_id
    entries = []
    for g, prompt in enumerate(prompts):
        for j in range(n_per_prompt):
            idx = g * n_per_prompt + j
            entries.append(
                Entry(
                    GenerateRequest(prompt.tokens, sample_seed(rollout_seed, seed_space, idx), params),
                    prompt,
                    g,
                    idx,
                    datasets[g] if datasets else None,
                )
            )
    return entries


async def to_samples(
    entries: list[Entry],
    outputs: list[GenerateOutput],
    tokenizer: Any,
    stops: Stops,
    scorer: Scorer,
    rollout_id: int,
    *,
    group_rm: bool = False,
) -> list[Row]:
    """Cut at stop strings, decode, score and package every completion as a `Sample` row.

    Status: `completed` when a stop id or stop string ended the response, `truncated` at the length limit,
    `failed` when the reward raised (reward 0, loss mask all zeros, the error in metadata). The reward sees
    slime's sample (rollout/sample.py) with that status; `group_rm`: slime's --group-rm (rollout/scoring.py)."""
    done = [
        finished_sample(pending_sample(e), out, tokenizer, stops)
        for e, out in zip(entries, outputs, strict=True)
    ]
    samples, reasons = [s for s, _ in done], [r for _, r in done]
    return await scored_rows(entries, samples, scorer, rollout_id, group_rm=group_rm, reasons=reasons)


def pending_sample(e: Entry) -> Sample:
    """slime's sample for entry `e` before generation: its prompt, label, a copy of its metadata, its seed."""
    return Sample(
        group_index=e.group_index,
        index=e.sample_index,
        prompt=e.prompt.text,
        tokens=list(e.request.prompt_tokens),
        label=e.prompt.label,
        metadata=dict(e.prompt.metadata),
        seed=e.request.seed,
    )


async def scored_rows(
    entries: list[Entry],
    samples: list[Sample],
    scorer: Scorer,
    rollout_id: int,
    *,
    group_rm: bool = False,
    reasons: list[str] | None = None,
    weight_version: int | None = None,
) -> list[Row]:
    """Score `samples` (one per entry, in order) and package them as rows, each with how it ended
    (`metadata["finish_reason"]`: `reasons[i]`, else the sample's own or its status's) and where its prompt came
    from; a rollout fails only if the reward failed on every sample. `weight_version`: the rows' (default: the
    engine's, from each sample)."""
    scored = await score_samples(scorer, samples, group_rm)
    extra = [
        {
            "finish_reason": reasons[i] if reasons else _reason(s),
            "prompt_row": e.prompt.row,
            **({"eval_dataset": e.dataset} if e.dataset is not None else {}),
        }
        for i, (e, s) in enumerate(zip(entries, samples, strict=True))
    ]
    rows = package(samples, scored, rollout_id, extra, weight_version)
    failed = [x for x in rows if x.status == "failed"]
    if rows and len(failed) == len(rows):
        raise RuntimeError(
            f"rollout {rollout_id}: the reward {scorer.name} failed on every sample, e.g. sample "
            f"{failed[0].sample_index}: {failed[0].metadata['reward_error']}"
        )
    return rows


def _reason(s: Sample) -> str:
    """How a plug-in's sample ended: what its metadata says, else its status's reason."""
    given = s.metadata.get("finish_reason")
    if isinstance(given, str):
        return given
    return "length" if s.status is Sample.Status.TRUNCATED else "stop"


def split_for_engines(entries: list[Entry], num_engines: int) -> list[list[Entry]]:
    """Whole prompt groups round-robin over engines (a group never straddles two engines)."""
    parts: list[list[Entry]] = [[] for _ in range(num_engines)]
    for e in entries:
        parts[e.group_index % num_engines].append(e)
    return parts


def sampling_metadata(params: SamplingParams, rollout_seed: int) -> dict[str, str]:
    """File-level metadata recorded with every rollout Parquet."""
    return {
        "sampling": json.dumps(
            {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "max_new_tokens": params.max_new_tokens,
                "rollout_seed": rollout_seed,
                "stop_token_ids": list(params.stop_token_ids),
            }
        )
    }
