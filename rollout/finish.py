"""A rollout finished: the engines' outputs scored with the run's reward, packaged as samples and written as the
rollout's Parquet artifact. It runs in the run's rollout actor (rollout/actor.py), as slime's rollout manager
scores and stores what it generated. So the orchestrating process only waits for the file's ref, and the
trainers' log-prob pass can follow on it through Ray. Everything here depends only on its arguments: the same
outputs give the same file."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifacts.schema import Sample as Row
from artifacts.store import ArtifactRef, write_rollout
from engines.base import GenerateOutput, StaleWeights
from rollout.requests import Entry, sampling_metadata, split_for_engines, to_samples
from rollout.rewards import RewardTimeout
from rollout.source import scoring_side, train_params

if TYPE_CHECKING:
    from config import RunConfig


@dataclass(frozen=True)
class Tally:
    """What the generate stage logs about a finished rollout besides its file."""

    tokens: int  # response tokens over every sample
    longest: int  # the longest response, in tokens
    seconds: float  # spent scoring and writing
    # the longest engine's generate call (EngineAnswer.seconds): set by the rollout actor, which has the answers
    generation: float = 0.0
    # what the run's console should warn about: samples whose reward call was abandoned (--rm-timeout)
    warnings: tuple[str, ...] = ()


def in_entry_order(
    entries: list[Entry], num_engines: int, answers: list[list[GenerateOutput]]
) -> list[GenerateOutput]:
    """The engines' outputs in `entries`' order; `answers`: one list per non-empty part of
    `split_for_engines(entries, num_engines)`, in part order (what each engine answered for its part)."""
    parts = [p for p in split_for_engines(entries, num_engines) if p]
    if len(parts) != len(answers):
        raise ValueError(f"{len(answers)} engine answers for {len(parts)} non-empty parts")
    by_index = {
        e.sample_index: out
        for part, outs in zip(parts, answers, strict=True)
        for e, out in zip(part, outs, strict=True)
    }
    return [by_index[e.sample_index] for e in entries]


def check_versions(
    parts: Mapping[int, list[GenerateOutput]], version: int, rollout_id: int, stage: str
) -> None:
    """StaleWeights unless every output of every engine part (engine index -> what that engine answered) was
    generated on weight `version`, naming the rollout, the stage, how many outputs of which engine differ and
    their versions."""
    wrong = []
    for engine, outputs in parts.items():
        stale = [o.weight_version for o in outputs if o.weight_version != version]
        if stale:
            wrong.append(
                f"{len(stale)} of {len(outputs)} outputs from engine {engine} have weight version "
                f"{' / '.join(str(v) for v in sorted(set(stale)))}"
            )
    if wrong:
        raise StaleWeights(
            f"rollout {rollout_id}, {stage}: {'; '.join(wrong)}, but the call names version {version}; refusing "
            "to score and write outputs of other weights"
        )


async def finish_rollout(
    cfg: RunConfig,
    rollout_id: int,
    entries: list[Entry],
    outputs: list[GenerateOutput],
    weights_sha256: str,
    path: str | Path,
    *,
    eval_mode: bool = False,
) -> tuple[ArtifactRef, Tally]:
    """Score `outputs` (in `entries`' order) with the run's reward, write them to `path` as rollout `rollout_id`
    generated on the weights `weights_sha256`, and return the file's ref and the tally. `eval_mode`: an eval set
    (the eval reward, `kind="eval"`; `rollout_id` is the eval id). The file's metadata holds only what its content
    determines, so the same samples give the same bytes (and sha256)."""
    began = time.perf_counter()
    tokenizer, stops, scorer, eval_scorer = scoring_side(cfg)
    samples = await to_samples(
        entries,
        outputs,
        tokenizer,
        stops,
        eval_scorer if eval_mode else scorer,
        rollout_id,
        group_rm=cfg.reward.group_rm and not eval_mode,  # slime: no group reward for eval
    )
    return write_finished(cfg, rollout_id, samples, weights_sha256, path, eval_mode=eval_mode, began=began)


def write_finished(
    cfg: RunConfig,
    rollout_id: int,
    samples: list[Row],
    weights_sha256: str,
    path: str | Path,
    *,
    eval_mode: bool,
    began: float,
    metadata: dict[str, Any] | None = None,
) -> tuple[ArtifactRef, Tally]:
    """Write scored `samples` as rollout `rollout_id` (see `finish_rollout`) and tally them; `began`: when
    scoring started (perf_counter), for the tally's seconds; `metadata`: more file metadata for a rollout."""
    _, stops, scorer, eval_scorer = scoring_side(cfg)
    if eval_mode:
        ref = write_rollout(path, samples, metadata={"weights_sha256": weights_sha256}, kind="eval")
    else:
        meta = {
            **sampling_metadata(train_params(cfg, stops), cfg.rollout.rollout_seed),
            "config_hash": cfg.config_hash(),
            "weights_sha256": weights_sha256,
            "tokenizer": cfg.hf_checkpoint or "",
            # what the engines computed at: a recording replayed by a trainer at another precision is named
            "precision": cfg.train.precision,
            **(metadata or {}),
        }
        ref = write_rollout(path, samples, metadata=meta)
    lengths = [s.response_length for s in samples]
    late = [s.sample_index for s in samples if _timed_out(s.metadata.get("reward_error"))]
    warnings: tuple[str, ...] = ()
    if late:
        used = eval_scorer if eval_mode else scorer
        warnings = (
            f"{'eval' if eval_mode else 'rollout'} {rollout_id}: reward {used.name} did not return within "
            f"{used.timeout:g} s (--rm-timeout) for {len(late)} of {len(samples)} samples (sample "
            f"{', '.join(map(str, late[:5]))}{', ...' if len(late) > 5 else ''}): abandoned, marked failed",
        )
    return ref, Tally(sum(lengths), max(lengths, default=0), time.perf_counter() - began, warnings=warnings)


def _timed_out(error: str | None) -> bool:
    return error is not None and error.startswith(f"{RewardTimeout.__name__}:")
