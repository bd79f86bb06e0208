"""Recording and replaying rollouts: --save-debug-rollout-data, --load-debug-rollout-data,
--load-forge-rollout-data and --ci-inject-rollout-data-path (slime/miles semantics, either format)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prefect import task

from artifacts.schema import Sample
from artifacts.slime_format import read_any, write_any
from artifacts.store import DEFAULT_LIMITS, ArtifactRef, ReadLimits, RunPaths, read_rollout, write_rollout
from config import RunConfig
from rollout.data import tokenizer_at
from rollout.replay import check_injection, subsample
from tasks import actors
from tasks.actors import stage_context
from tasks.metrics import log_metrics


def record_rollout(cfg: RunConfig, rollout_id: int | str, samples: list[Sample]) -> str | None:
    """Write `samples` to the rollout template (eval rollouts pass "eval_<id>"); returns the path."""
    template = cfg.rollout_template
    if template is None:
        return None
    path = template.format(rollout_id=rollout_id)
    write_any(path, rollout_id, samples, metadata={"config_hash": cfg.config_hash()})
    return path


def read_limits(cfg: RunConfig, *, rows: int | None = None) -> ReadLimits:
    """What a Parquet this run reads may hold: no list longer than the model's positions (its config.json's
    max_position_embeddings, when it gives one), at most `rows` rows when given."""
    import json

    positions = None
    try:
        positions = json.loads((Path(cfg.hf_checkpoint or "") / "config.json").read_text()).get(
            "max_position_embeddings"
        )
    except (OSError, ValueError, AttributeError):
        pass  # no readable model config: check_paths names that; the defaults still bound the read
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 1:
        positions = DEFAULT_LIMITS.list_len
    return ReadLimits(
        rows=DEFAULT_LIMITS.rows if rows is None else rows, list_len=positions, bytes=DEFAULT_LIMITS.bytes
    )


def recording_path(template: str, rollout_id: int, *, fallback_to_zero: bool) -> Path:
    """The recording of `rollout_id`: a literal path is reused every rollout; a template is
    formatted per rollout and, for forge replay, falls back to rollout 0's recording."""
    path = Path(template.format(rollout_id=rollout_id))
    if not path.exists() and fallback_to_zero and "{rollout_id}" in template:
        path = Path(template.format(rollout_id=0))
    if not path.exists():
        raise FileNotFoundError(f"recording for rollout {rollout_id} not found: {path}")
    return path


def _as_rollout(samples: list[Sample], rollout_id: int) -> list[Sample]:
    """Samples relabelled as rollout `rollout_id` (the recorded id is kept in metadata)."""
    return [
        s
        if s.rollout_id == rollout_id
        else replace(s, rollout_id=rollout_id, metadata={**s.metadata, "recorded_rollout_id": s.rollout_id})
        for s in samples
    ]


@task(name="load-rollout", log_prints=True)
async def load_rollout(cfg: RunConfig, rollout_id: int, template: str, forge: bool = False) -> ArtifactRef:
    """Read a recorded rollout (`.parquet` or slime `.pt`) and publish it as this rollout's artifact."""
    ctx = stage_context(rollout_id, "load-rollout")
    path = recording_path(template, rollout_id, fallback_to_zero=forge)
    samples = read_any(path, trust_pickle=cfg.debug.trust_pickle, limits=read_limits(cfg))
    if cfg.debug.load_debug_rollout_data_subsample is not None:
        samples = subsample(samples, cfg.debug.load_debug_rollout_data_subsample)
    print(f"rollout {rollout_id}: loaded {len(samples)} samples from {path}")
    ref = write_rollout(
        RunPaths(cfg.resolved_run_dir).rollout(rollout_id),
        _as_rollout(samples, rollout_id),
        metadata={"recorded_from": str(path)},
    )
    actors.stage_end(cfg, "load-rollout", ctx)
    return ref


@task(name="inject", log_prints=True)
async def inject(cfg: RunConfig, rollout_id: int, fresh: ArtifactRef) -> ArtifactRef:
    """Compare the fresh generation with the recording (prompts identical, mean response match ratio
    above --ci-inject-rollout-data-min-match-ratio), then train on the recording instead."""
    d, ctx = cfg.debug, stage_context(rollout_id, "inject")
    assert d.ci_inject_rollout_data_path is not None
    path = recording_path(d.ci_inject_rollout_data_path, rollout_id, fallback_to_zero=False)
    recorded = read_any(path, trust_pickle=d.trust_pickle, limits=read_limits(cfg))
    result = check_injection(
        read_rollout(fresh),
        recorded,
        d.ci_inject_rollout_data_min_match_ratio,
        # the trainer's view of the prompts, asked for only when the responses differ
        lambda texts: tokenizer_at(str(cfg.hf_checkpoint))(texts, add_special_tokens=False)["input_ids"],
    )
    ref = write_rollout(
        RunPaths(cfg.resolved_run_dir).rollout(rollout_id),
        _as_rollout(recorded, rollout_id),
        metadata={"recorded_from": str(path)},
    )
    actors.stage_end(cfg, "inject", ctx)
    log_metrics(cfg, "check", rollout_id, {f"check/inject_{k}": float(v) for k, v in result.items()})
    return ref
