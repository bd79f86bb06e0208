"""The default rollout function: problems -> engine requests -> scored samples.

Pure apart from the tokenizer; the `generate` task calls engines with what `build_requests`
returns and hands the outputs to `to_samples`. Seeds are derived per sample from
(rollout_seed, rollout_id, sample_index), stored with the sample, and reused by a replay.
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from typing import Any

from artifacts.schema import Sample
from engines.base import GenerateOutput, GenerateRequest, SamplingParams
from flows.config import RunConfig
from recipes.registry import Recipe

EVAL_ID_OFFSET = 1 << 20  # eval sample seeds live apart from training ones


def sample_seed(rollout_seed: int, rollout_id: int, sample_index: int) -> int:
    """A stable 63-bit seed for one sample (independent of batch layout and process)."""
    digest = hashlib.sha256(f"{rollout_seed}:{rollout_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def problems_for_rollout(pool: list[dict], cfg: RunConfig, rollout_id: int) -> list[dict]:
    """The prompts of one rollout: consecutive slices of a per-epoch permutation of the pool
    (permutation seeded by rollout_seed + epoch, as slime shuffles its dataset)."""
    n = cfg.rollout.rollout_batch_size
    out = []
    for k in range(rollout_id * n, (rollout_id + 1) * n):
        epoch, pos = divmod(k, len(pool))
        out.append(pool[_epoch_order(len(pool), cfg.rollout.rollout_seed + epoch)[pos]])
    return out


@lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return tuple(order)


def build_requests(problems: list[dict], tokenizer: Any, recipe: Recipe, cfg: RunConfig, rollout_id: int,
                   n_per_prompt: int, temperature: float, eval_mode: bool = False) -> list[dict]:
    """One entry per sample: {"request", "prompt", "label", "group_index", "sample_index"}."""
    params = SamplingParams(
        temperature=temperature, top_p=cfg.rollout.rollout_top_p, top_k=cfg.rollout.rollout_top_k,
        max_new_tokens=cfg.rollout.rollout_max_response_len,
        stop_token_ids=(int(tokenizer.eos_token_id),))
    seed_space = rollout_id + EVAL_ID_OFFSET if eval_mode else rollout_id
    entries = []
    for g, problem in enumerate(problems):
        prompt = recipe.format_prompt(tokenizer, problem["question"])
        tokens = tuple(tokenizer.encode(prompt, add_special_tokens=False))
        for j in range(n_per_prompt):
            idx = g * n_per_prompt + j
            seed = sample_seed(cfg.rollout.rollout_seed, seed_space, idx)
            entries.append({"request": GenerateRequest(tokens, seed, params), "prompt": prompt,
                            "label": problem["label"], "group_index": g, "sample_index": idx})
    return entries


def to_samples(entries: list[dict], outputs: list[GenerateOutput], tokenizer: Any, recipe: Recipe,
               rollout_id: int) -> list[Sample]:
    """Decode, score and package every completion as a `Sample` row."""
    samples = []
    for e, out in zip(entries, outputs, strict=True):
        text = tokenizer.decode(list(out.response_tokens), skip_special_tokens=True)
        samples.append(Sample(
            rollout_id=rollout_id, group_index=e["group_index"], sample_index=e["sample_index"],
            prompt=e["prompt"], prompt_tokens=list(e["request"].prompt_tokens), response=text,
            response_tokens=list(out.response_tokens), response_length=len(out.response_tokens),
            label=e["label"], reward=float(recipe.reward(text, e["label"])),
            status="completed" if out.finish_reason == "stop" else "truncated",
            loss_mask=[1] * len(out.response_tokens), rollout_log_probs=list(out.log_probs),
            weight_version=out.weight_version, seed=e["request"].seed,
            metadata={"finish_reason": out.finish_reason}))
    return samples


def split_for_engines(entries: list[dict], num_engines: int) -> list[list[dict]]:
    """Whole prompt groups round-robin over engines (a group never straddles two engines)."""
    parts: list[list[dict]] = [[] for _ in range(num_engines)]
    for e in entries:
        parts[e["group_index"] % num_engines].append(e)
    return parts


def sampling_metadata(cfg: RunConfig, temperature: float) -> dict[str, str]:
    """File-level metadata recorded with every rollout Parquet."""
    r = cfg.rollout
    return {"sampling": json.dumps({"temperature": temperature, "top_p": r.rollout_top_p, "top_k": r.rollout_top_k,
                                    "max_new_tokens": r.rollout_max_response_len, "rollout_seed": r.rollout_seed})}
