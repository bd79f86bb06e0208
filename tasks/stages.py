"""The stages of one rollout, as Prefect tasks: generate, save-rollout, log-prob, train-step, sync, check (and
eval). Each resolves refs, calls the run's actors, writes artifacts and returns refs.

Every actor call a stage stands for is made and awaited inside its own task run. So the task's span in the
Prefect UI holds its work. A retried task asks its actors again, and they check the state the retry depends
on:
- an engine generates only on the weight version the call names;
- the rollout actor checks the version of every output;
- a trainer refuses a log-prob pass for a rollout whose step it applied.

`flows.stages.Stages`, the one place that configures these tasks, applies the retry policy and `--refresh`."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact

from artifacts.atomic import atomic_write_text
from artifacts.hashing import differing_tensors
from artifacts.store import ArtifactRef, RunPaths, read_rollout
from config import RunConfig
from config.precision import logprob_abs_tol
from engines.base import GenerateRequest
from engines.regenerate import NotReproduced
from rollout.data import prompts_for_rollout
from rollout.dynamic import dynamic_sampling, logged_metrics
from rollout.finish import Tally
from rollout.plugins import uses_plugins
from rollout.requests import Entry, build_requests, split_for_engines
from rollout.source import cached, eval_params, rollout_source, train_params
from tasks import actors
from tasks.actors import stage_context
from tasks.cache import RefCachePolicy
from tasks.checks import (
    REEXECUTION_CHECKS,
    CheckFailed,
    EngineWeights,
    Violation,
    grad_norm_checker,
    kl_checker,
    logprob_checker,
    out_of_sync_message,
    raise_if_any,
    weight_update_failure,
)
from tasks.metrics import eval_stats, log_metrics, non_finite, reward_stats
from tasks.notify import notice
from tasks.recordings import record_rollout
from tasks.recovery import guarded
from tasks.refs import LogProbs, WeightsRef
from tasks.trackers import eval_step
from tasks.transfer import Pushed, trainer_weights, transfer_for
from trainers.determinism import NotDeterministic


def _paths(cfg: RunConfig) -> RunPaths:
    return RunPaths(cfg.resolved_run_dir)


def _per_engine(
    cfg: RunConfig, entries: list[Entry]
) -> tuple[list[list[Entry]], list[list[GenerateRequest]]]:
    """Whole groups spread over the engines: each engine's entries and their requests."""
    parts = split_for_engines(entries, cfg.rollout.rollout_num_engines)
    return parts, [[e.request for e in part] for part in parts]


def train_requests(cfg: RunConfig, rollout_id: int) -> list[Entry]:
    """Rollout `rollout_id`'s requests: its prompts, each `n_samples_per_prompt` times, seeded per sample. Made
    once per process and config; callers do not modify the list."""

    def make() -> list[Entry]:
        src, r = rollout_source(cfg), cfg.rollout
        assert src.train is not None
        prompts = prompts_for_rollout(
            src.train.prompts, r.rollout_batch_size, rollout_id, r.rollout_seed, cfg.data.rollout_shuffle
        )
        return build_requests(
            prompts, r.rollout_seed, rollout_id, r.n_samples_per_prompt, train_params(cfg, src.stops)
        )

    return cached(_REQUESTS, f"{cfg.config_hash()}:{rollout_id}", make)


_REQUESTS: dict[str, list[Entry]] = {}


def eval_requests(cfg: RunConfig, eval_id: int) -> list[Entry]:
    """Eval `eval_id`'s requests: every eval dataset's prompts, each `n_samples_per_eval_prompt` times, seeded per
    sample. Made once per process and config, as `train_requests`; callers do not modify the list."""

    def make() -> list[Entry]:
        src = rollout_source(cfg)
        return build_requests(
            [p for _, s in src.evals for p in s.prompts],
            cfg.rollout.rollout_seed,
            eval_id,
            cfg.eval.n_samples_per_eval_prompt,
            eval_params(cfg, src.stops),
            eval_mode=True,
            datasets=[name for name, s in src.evals for _ in s.prompts],
        )

    return cached(_EVAL_REQUESTS, f"{cfg.config_hash()}:{eval_id}", make)


_EVAL_REQUESTS: dict[str, list[Entry]] = {}


def _rollout_path(cfg: RunConfig, rollout_id: int, fresh: bool) -> str:
    """Where generate writes rollout `rollout_id` (`fresh_<id>.parquet` when a recording is injected in its place)."""
    path = _paths(cfg).rollout(rollout_id)
    return str(path.with_name(f"fresh_{rollout_id:06d}.parquet") if fresh else path)


def injects(cfg: RunConfig, rollout_id: int) -> bool:
    """Whether rollout `rollout_id` trains on an injected recording instead of its generation."""
    d = cfg.debug
    return bool(d.ci_inject_rollout_data_path) and rollout_id >= d.ci_inject_rollout_data_start_rollout_id


def _logprobs_out(cfg: RunConfig, rollout_id: int) -> str:
    return str(_paths(cfg).logprobs(rollout_id))


@dataclass(frozen=True)
class Generated:
    """A generated rollout: its file's ref, its tally, and the seconds the longest engine spent generating it."""

    rollout: ArtifactRef
    tally: Tally
    seconds: float


async def _generate(
    cfg: RunConfig,
    entries: list[Entry],
    rollout_id: int,
    weights: WeightsRef,
    path: str,
    ctx: dict[str, Any],
    eval_mode: bool = False,
) -> Generated:
    """Each engine generates its part of `entries` on the weights `weights`; an engine holding another version
    refuses. Then the rollout actor checks every output's weight version, scores them and writes the rollout
    (an eval set with `eval_mode`) to `path` (rollout/actor.py). Both are submitted at once: Ray hands the
    engines' answers to the rollout actor without a round trip through this process."""
    _, parts = _per_engine(cfg, entries)
    engines = actors.engines(cfg)
    if not eval_mode and dynamic_sampling(cfg):  # draws until the filter keeps a batch (rollout/dynamic.py)
        ref, tally = actors.rollout_actor(cfg).generate_dynamic.remote(
            cfg, rollout_id, engines, weights.version, weights.sha256, path, ctx
        )
    elif uses_plugins(cfg):  # the rollout actor drives the engines through the plug-in (rollout/plugins.py)
        ref, tally = actors.rollout_actor(cfg).generate_with_plugins.remote(
            cfg,
            rollout_id,
            entries,
            engines,
            weights.version,
            weights.sha256,
            path,
            eval_mode=eval_mode,
            ctx=ctx,
        )
    else:
        answers = [
            e.generate.remote(part, weights.version, ctx)
            for e, part in zip(engines, parts, strict=True)
            if part
        ]
        ref, tally = actors.rollout_actor(cfg).finish_rollout.remote(
            cfg,
            rollout_id,
            entries,
            weights.version,
            weights.sha256,
            path,
            *answers,
            eval_mode=eval_mode,
            ctx=ctx,
        )
    rollout, counted = await asyncio.gather(ref, tally)
    for line in counted.warnings:
        notice(line, logging.WARNING)
    return Generated(rollout, counted, counted.generation)


@task(
    name="generate",
    cache_policy=RefCachePolicy(sections=("rollout", "data", "reward")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def generate(cfg: RunConfig, rollout_id: int, weights: WeightsRef, fresh: bool = False) -> ArtifactRef:
    """Sample `rollout_batch_size x n_samples_per_prompt` responses on the engines' `weights`, score them and
    write rollout_{id}.parquet (`fresh_{id}.parquet` when a recording will be injected in its place)."""
    ctx = stage_context(rollout_id, "generate")
    path = _rollout_path(cfg, rollout_id, fresh)
    try:
        generated = await guarded(
            cfg,
            f"generate {rollout_id}",
            _generate(cfg, train_requests(cfg, rollout_id), rollout_id, weights, path, ctx),
            cfg.faults.rollout_timeout,
            engines=True,
            weights=weights,
        )
    except NotReproduced:
        log_metrics(cfg, "check", rollout_id, {REEXECUTION_CHECKS["generate"]: 0.0})
        raise
    actors.stage_end(cfg, "generate", ctx)
    # the torch engine re-generated a few requests of each call (engines/regenerate.py; its engines only)
    if (
        cfg.ci.ci_test
        and not cfg.ci.ci_disable_reexecution_checker
        and cfg.rollout.rollout_backend == "torch"
    ):
        log_metrics(cfg, "check", rollout_id, {REEXECUTION_CHECKS["generate"]: 1.0})
    seconds, tally = generated.seconds, generated.tally
    log_metrics(
        cfg,
        "perf",
        rollout_id,
        {
            "perf/rollout_time": seconds,
            "perf/tokens_per_sec": tally.tokens / seconds,
            # slime's per-GPU throughput; on CPU an engine is the unit
            "perf/tokens_per_engine_per_sec": tally.tokens / seconds / cfg.rollout.rollout_num_engines,
            "perf/longest_sample_tokens_per_sec": tally.longest / seconds,
        },
    )
    return generated.rollout


@task(
    name="save-rollout",
    cache_policy=RefCachePolicy(sections=("rollout",)),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def save_rollout(
    cfg: RunConfig,
    rollout_id: int,
    rollout: ArtifactRef,
    loaded: bool = False,
) -> dict[str, float]:
    """Verify the rollout artifact, record it where --save-debug-rollout-data / --dump-details ask,
    and log its rollout-side metrics (`rollout N: {...}`); loaded recordings skip the metrics, as in slime."""
    samples = read_rollout(rollout)
    record_rollout(cfg, rollout_id, samples)
    actors.stage_end(cfg, "save-rollout", stage_context(rollout_id, "save-rollout"))
    if loaded:
        return {}
    stats = {**reward_stats(samples, cfg.rollout.n_samples_per_prompt), **logged_metrics(rollout)}
    log_metrics(cfg, "rollout", rollout_id, stats)
    return stats


@task(
    name="log-prob",
    cache_policy=RefCachePolicy(sections=("rollout", "train")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def log_prob(cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef) -> LogProbs:
    """Trainer log-probs (+ reference log-probs, entropy) of every response token, written to
    logprobs/rollout_{id}.parquet, and their statistics. With --offload-rollout the engines release their weights
    first (they step aside for the trainer until the sync); a trainer that already applied this rollout's step
    refuses the pass."""
    engines, trainers = actors.engines(cfg), actors.trainers(cfg)
    ctx, what = stage_context(rollout_id, "log-prob"), f"log-prob {rollout_id}"
    if cfg.placement.offloads_rollout:
        await guarded(
            cfg,
            what,
            asyncio.gather(*[e.release_memory.remote() for e in engines]),
            cfg.faults.rollout_timeout,
            engines=True,
            weights=weights,
        )
    written = [t.compute_log_probs.remote(rollout, _logprobs_out(cfg, rollout_id), ctx) for t in trainers]
    # rank 0 runs its calls in order and Ray hands it the ref it wrote
    stats = trainers[0].rollout_stats.remote(rollout, written[0])
    start_weights = RunPaths(cfg.resolved_run_dir).start_weights
    # the doctor tells "the reference is not the starting model" from a forward that is not deterministic by these
    start = [] if start_weights.exists() else [trainers[0].reference_and_start_sha256.remote()]
    table, *answers = await guarded(
        cfg, what, asyncio.gather(*written, *start, stats), cfg.faults.train_timeout, trainers=True
    )
    computed = answers[-1]
    if start and (hashes := answers[-2]):
        atomic_write_text(start_weights, json.dumps({**hashes, "rollout_id": rollout_id}))
    actors.stage_end(cfg, "log-prob", ctx)
    log_metrics(cfg, "rollout", rollout_id, computed)
    return LogProbs(table=table, stats=computed)


@task(
    name="train-step",
    cache_policy=RefCachePolicy(sections=("rollout", "train")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def train_step(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, logprobs: ArtifactRef, session: str
) -> list[dict[str, Any]]:
    """Every optimizer step of this rollout on every rank, then each rank's step-boundary snapshot; a trainer
    that applied this rollout already returns the metrics it applied (a retry never trains twice).

    Training changes actor state, so its cache is scoped to the trainer `session` (the actors of one
    `rollflow run`). Re-running a rollout flow against the same actors returns the cached metrics. A fresh run
    with fresh actors trains for real."""
    ctx, trainers = stage_context(rollout_id, "train-step"), actors.trainers(cfg)
    steps = [t.train_step.remote(rollout, logprobs, cfg.train_data_template, ctx) for t in trainers]
    try:
        per_rank_and_perf = await guarded(
            cfg,
            f"train-step {rollout_id}",
            asyncio.gather(*steps, trainers[0].perf.remote()),
            cfg.faults.train_timeout,
            trainers=True,
        )
    except NotDeterministic as e:
        log_metrics(cfg, "check", rollout_id, {REEXECUTION_CHECKS[e.stage]: 0.0})
        raise
    actors.stage_end(cfg, "train-step", ctx)
    metrics, perf = per_rank_and_perf[0], per_rank_and_perf[-1]
    for m in metrics:
        log_metrics(cfg, "step", rollout_id, m, step=int(m["train/step"]))
    log_metrics(cfg, "perf", rollout_id, perf)
    if cfg.ci.ci_test and not cfg.ci.ci_disable_reexecution_checker:  # re-executed (trainers/determinism.py)
        ran = ["train-step"] if cfg.train.use_rollout_logprobs else ["log-prob", "train-step"]
        log_metrics(cfg, "check", rollout_id, {REEXECUTION_CHECKS[stage]: 1.0 for stage in ran})
    return metrics


@task(name="sync", log_prints=True)
async def sync(cfg: RunConfig, rollout_id: int, verify_equal: bool = False) -> WeightsRef:
    """Push the trainer's weights to every engine as version `rollout_id + 1`.

    `verify_equal` (the weight-update checker, on the first sync): engines scramble every weight
    first, and after the sync every tensor must equal the trainer's bitwise."""
    engines = actors.engines(cfg)
    version, ctx, what = rollout_id + 1, stage_context(rollout_id, "sync"), f"sync {rollout_id}"
    # what the engines held before: the check tells an engine the transfer did not reach by it (a hash the
    # engine has cached since the last check; not asked at the start-up sync, where nothing was synced yet)
    held_before = engines[0].weights_sha256.remote() if rollout_id >= 0 and not verify_equal else None
    # an engine runs one caller's calls in order: resume (--offload-rollout), scramble, then the transfer's loads,
    # which deliver every weight (a released engine refuses to generate until each one came)
    before = [
        *([e.resume_memory.remote() for e in engines] if cfg.placement.offloads_rollout else []),
        *([e.snapshot_and_scramble.remote() for e in engines] if verify_equal else []),
    ]
    if (
        cfg.debug.debug_skip_weight_update
    ):  # the schedule around the transfer still runs; the engines keep theirs
        await guarded(cfg, what, asyncio.gather(*before), cfg.faults.update_weights_timeout, engines=True)
        print(f"sync {rollout_id}: --debug-skip-weight-update: weight transfer skipped")
        held = WeightsRef(
            version=await engines[0].weight_version.remote(), sha256=await engines[0].weights_sha256.remote()
        )
        actors.stage_end(cfg, "sync", ctx)
        return held
    pushed = await guarded(
        cfg,
        what,
        _pushed(before, transfer_for(cfg).push(cfg, engines, version, ctx)),
        cfg.faults.update_weights_timeout,
        engines=True,
        trainers=True,
    )
    if verify_equal:
        skip = {s for s in (cfg.ci.check_weight_update_skip_list or "").split(",") if s}
        held_hashes = await asyncio.gather(*[e.tensor_hashes.remote() for e in engines])
        bad = {
            i: [n for n in differing_tensors(pushed.tensor_hashes, h) if n not in skip]
            for i, h in enumerate(held_hashes)
        }
        bad = {i: names for i, names in bad.items() if names}
        log_metrics(cfg, "check", rollout_id + 1, {"check/weight_update_equal": 0.0 if bad else 1.0})
        if bad:
            raise CheckFailed("; ".join(weight_update_failure(i, names) for i, names in bad.items()))
    actors.stage_end(cfg, "sync", ctx)
    previous = await held_before if held_before is not None else None
    return WeightsRef(version=version, sha256=pushed.sha256, previous_sha256=previous)


async def _pushed(before: list[Any], push: Any) -> Pushed:
    """The transfer's result once the engines' calls submitted before it are answered too."""
    *_, pushed = await asyncio.gather(*before, push)
    return pushed


@task(name="check", log_prints=True)
async def check(
    cfg: RunConfig,
    rollout_id: int,
    steps: list[dict[str, Any]],
    weights: WeightsRef | None,
    logprob_stats: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Invariants of one rollout: finite metrics; every engine holds the trainer's weights
    (`weights` is None when nothing was synced: rollout-only and train-only runs); with --ci-test, the KL,
    log-prob (on `logprob_stats`, the log-prob stage's statistics) and grad-norm checkers. A checker's failure
    raises CheckFailed, which is never retried."""
    ctx = stage_context(rollout_id, "check")
    bad = [f"step {m.get('train/step')}: {k}" for m in steps for k in non_finite(m)]
    if bad:
        raise CheckFailed(f"rollout {rollout_id}: non-finite training metrics: {bad}")
    violations = _ci_violations(cfg, rollout_id, steps, logprob_stats or {})
    if cfg.ci.ci_test or violations:
        body = "\n".join(f"- {v}" for v in violations) or "- KL, log-prob and grad-norm checkers: all passed"
        await acreate_markdown_artifact(
            f"## Checks of rollout {rollout_id}\n\n{body}",
            key=f"{artifact_slug(cfg.name)}-rollout-{rollout_id}-checks",
            description=f"--ci-test checks of rollout {rollout_id}",
        )
    if violations:
        log_metrics(cfg, "check", rollout_id, {"check/violations": float(len(violations))})
        raise_if_any(violations)
    if weights is None:
        actors.stage_end(cfg, "check", ctx)
        result = {"check/finite_metrics": 1.0}
        log_metrics(cfg, "check", rollout_id, result)
        return result
    engines = actors.engines(cfg)
    answers = await guarded(
        cfg,
        f"check {rollout_id}",
        asyncio.gather(
            *[e.weight_version.remote() for e in engines], *[e.weights_sha256.remote() for e in engines]
        ),
        cfg.faults.rollout_timeout,
        engines=True,
        weights=weights,
    )
    versions, shas = answers[: len(engines)], answers[len(engines) :]
    wrong = [
        i
        for i, (v, s) in enumerate(zip(versions, shas, strict=True))
        if v != weights.version or s != weights.sha256
    ]
    if wrong:
        raise CheckFailed(await _out_of_sync(cfg, rollout_id, weights, wrong, versions, shas))
    actors.stage_end(cfg, "check", ctx)
    result = {
        "check/finite_metrics": 1.0,
        "check/engines_in_sync": 1.0,
        "check/weight_version": weights.version,
    }
    log_metrics(cfg, "check", rollout_id, result)
    return result


async def _out_of_sync(
    cfg: RunConfig,
    rollout_id: int,
    weights: WeightsRef,
    wrong: list[int],
    versions: list[Any],
    shas: list[Any],
) -> str:
    """The engines-in-sync failure message; per-tensor hashes are asked for only here, on a failure."""
    engines = actors.engines(cfg)
    mismatched = [i for i in wrong if shas[i] != weights.sha256]
    hashes = (
        await guarded(
            cfg,
            f"check {rollout_id}",
            asyncio.gather(_trainer_hashes(cfg), *[engines[i].tensor_hashes.remote() for i in mismatched]),
            cfg.faults.rollout_timeout,
            engines=True,
            trainers=True,
            weights=weights,
        )
        if mismatched
        else [None]
    )
    per_engine = dict(zip(mismatched, hashes[1:], strict=True))
    states = [EngineWeights(i, versions[i], shas[i], per_engine.get(i)) for i in wrong]
    return out_of_sync_message(
        rollout_id,
        weights.version,
        weights.sha256,
        states,
        hashes[0],
        weights.previous_sha256,
        str(cfg.resolved_run_dir),
    )


async def _trainer_hashes(cfg: RunConfig) -> dict[str, str]:
    return (await trainer_weights(cfg)).tensor_hashes


def artifact_slug(name: str) -> str:
    """A run name as Prefect artifact keys allow it (lowercase letters, digits, dashes)."""
    return name.lower().replace("_", "-").replace(".", "-")


def _ci_violations(
    cfg: RunConfig, rollout_id: int, steps: list[dict[str, Any]], stats: dict[str, float]
) -> list[Violation]:
    """The --ci-test checkers that live in the check task (KL, log-probs, grad norm)."""
    ci, out = cfg.ci, []
    if ci.ci_test and not ci.ci_disable_kl_checker:
        out += kl_checker(
            steps, rollout_id, first_step_of_run=0, recomputed_old=not cfg.train.use_rollout_logprobs
        )
    if ci.ci_test and not ci.ci_disable_logprobs_checker and not cfg.rollout_only:
        out += logprob_checker(
            stats,
            rollout_id,
            rollout_id == 0,
            logprob_abs_tol(cfg.train.precision, ci.ci_logprobs_checker_abs_tol),
            ci.ci_entropy_max,
        )
    if ci.ci_save_grad_norm or ci.ci_load_grad_norm:
        out += grad_norm_checker(cfg, steps, rollout_id)
    return out


@task(
    name="eval",
    cache_policy=RefCachePolicy(sections=("rollout", "eval", "data", "reward")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def evaluate(cfg: RunConfig, eval_id: int, weights: WeightsRef) -> dict[str, float]:
    """Every --eval-prompt-data dataset with the weights of version `eval_id`: `eval/NAME` (mean reward) and
    `eval/NAME-truncated_ratio`, one generation over all datasets, written to eval_{id}.parquet."""
    src, ctx = rollout_source(cfg), stage_context(eval_id, "eval")
    path = str(_paths(cfg).eval_rollout(eval_id))
    generated = await guarded(
        cfg,
        f"eval {eval_id}",
        _generate(cfg, eval_requests(cfg, eval_id), eval_id, weights, path, ctx, eval_mode=True),
        cfg.faults.rollout_timeout,
        engines=True,
        weights=weights,
    )
    samples = read_rollout(generated.rollout)
    record_rollout(cfg, f"eval_{eval_id}", samples)
    actors.stage_end(cfg, "eval", ctx)
    metrics = eval_stats(samples, [name for name, _ in src.evals])
    log_metrics(cfg, "eval", eval_id, {**metrics, "eval/step": eval_step(eval_id)})
    return metrics


@task(name="save", log_prints=True)
async def save_checkpoint(cfg: RunConfig, rollout_id: int) -> str:
    """Write iter_{rollout_id:07d}/ under --save (rank 0 writes; all ranks hold the same weights)."""
    ctx = stage_context(rollout_id, "save")
    await guarded(
        cfg,
        f"save {rollout_id}",
        asyncio.gather(*[t.save.remote(cfg.checkpoint.save, rollout_id, ctx) for t in actors.trainers(cfg)]),
        cfg.faults.train_timeout,
        trainers=True,
    )
    print(f"saved checkpoint iter_{rollout_id:07d} to {cfg.checkpoint.save}")
    return str(cfg.checkpoint.save)
