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

from artifacts.schema import Sample
from engines.base import GenerateOutput, GenerateRequest, SamplingParams
from rollout.data import Prompt
from rollout.rewards import RewardRequest, Scorer
from rollout.template import Stops, cut_at_stop_string

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
) -> list[Sample]:
    """Cut at stop strings, decode, score and package every completion as a `Sample` row.

    Status: `completed` when a stop id or stop string ended the response, `truncated` at the length limit,
    `failed` when the reward raised (reward 0, loss mask all zeros, the error in metadata)."""
    cut = []
    for out in outputs:
        tokens, log_probs, reason = list(out.response_tokens), list(out.log_probs), out.finish_reason
        n = cut_at_stop_string(tokens, tokenizer, stops.strings)
        if n is not None and (n < len(tokens) or reason != "stop"):
            tokens, log_probs, reason = tokens[:n], log_probs[:n], "stop_string"
        cut.append((tokens, log_probs, reason, tokenizer.decode(tokens, skip_special_tokens=True)))
    scored = await scorer.score(
        [
            RewardRequest(e.prompt.text, text, e.prompt.label, e.prompt.metadata, e.sample_index)
            for e, (_, _, _, text) in zip(entries, cut, strict=True)
        ]
    )
    samples = []
    for e, out, (tokens, log_probs, reason, text), s in zip(entries, outputs, cut, scored, strict=True):
        meta: dict[str, Any] = {**e.prompt.metadata, "finish_reason": reason, "prompt_row": e.prompt.row}
        if e.dataset is not None:
            meta["eval_dataset"] = e.dataset
        if s.extra:
            meta["reward_extra"] = s.extra
        status = "truncated" if reason == "length" else "completed"
        if s.error is not None:
            status, meta["reward_error"] = "failed", s.error
        samples.append(
            Sample(
                rollout_id=rollout_id,
                group_index=e.group_index,
                sample_index=e.sample_index,
                prompt=e.prompt.text,
                prompt_tokens=list(e.request.prompt_tokens),
                response=text,
                response_tokens=tokens,
                response_length=len(tokens),
                label=_label_text(e.prompt.label),
                reward=s.reward,
                status=status,
                loss_mask=[0 if s.error else 1] * len(tokens),
                rollout_log_probs=log_probs,
                weight_version=out.weight_version,
                seed=e.request.seed,
                metadata=meta,
            )
        )
    failed = [x for x in samples if x.status == "failed"]
    if samples and len(failed) == len(samples):
        raise RuntimeError(
            f"rollout {rollout_id}: the reward {scorer.name} failed on every sample, e.g. sample "
            f"{failed[0].sample_index}: {failed[0].metadata['reward_error']}"
        )
    return samples


def _label_text(label: Any) -> str:
    """The label column is text: strings as they are, anything else as JSON (None -> "")."""
    if label is None:
        return ""
    return label if isinstance(label, str) else json.dumps(label, sort_keys=True, ensure_ascii=False)


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
