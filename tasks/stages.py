"""The stages of one rollout, as Prefect tasks: generate, save-rollout, log-prob, train-step, sync,
check (and eval). Each resolves refs, calls the run's actors, writes artifacts and returns refs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from prefect import task
from prefect.artifacts import acreate_markdown_artifact

from artifacts.hashing import differing_tensors
from artifacts.store import ArtifactRef, RunPaths, read_rollout
from config import RunConfig
from engines.base import GenerateRequest
from rollout.data import prompts_for_rollout
from rollout.requests import Entry, build_requests, split_for_engines
from rollout.source import cached, eval_params, rollout_source, train_params
from tasks import actors, notify, prefetch
from tasks.cache import RefCachePolicy
from tasks.checks import (
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
from tasks.recordings import record_rollout
from tasks.recovery import guarded
from tasks.refs import LogProbs, WeightsRef
from tasks.transfer import Pushed, chained, trainer_weights, transfer_for


def _paths(cfg: RunConfig) -> RunPaths:
    return RunPaths(cfg.resolved_run_dir)


def _ctx(rollout_id: int) -> dict[str, int]:
    """The context an actor's fault hooks filter on: the rollout and this task run's attempt (0, 1, ...)."""
    from prefect.runtime import task_run

    return {"rollout_id": rollout_id, "attempt": max(0, int(task_run.run_count or 1) - 1)}


def _per_engine(
    cfg: RunConfig, entries: list[Entry]
) -> tuple[list[list[Entry]], list[list[GenerateRequest]]]:
    """Whole groups spread over the engines: each engine's entries and their requests."""
    parts = split_for_engines(entries, cfg.rollout.rollout_num_engines)
    return parts, [[e.request for e in part] for part in parts]


def train_requests(cfg: RunConfig, rollout_id: int) -> list[Entry]:
    """Rollout `rollout_id`'s requests: its prompts, each `n_samples_per_prompt` times, seeded per sample. Made
    once per process and config (the head starts and the generate task ask for the same rollout's: a sha256 per
    sample); callers do not modify the list."""

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


def _generates_ahead(cfg: RunConfig) -> bool:
    """Whether a rollout's generation may start before its generate task (tasks/prefetch.py): it generates on the
    engines (not train-only, not a loaded recording) and --debug-sequential-stages is off."""
    d = cfg.debug
    return not (
        cfg.train_only or d.load_debug_rollout_data or d.load_forge_rollout_data or d.debug_sequential_stages
    )


def start_next_generation(
    cfg: RunConfig, rollout_id: int, weights: WeightsRef, log_probs: bool = True
) -> None:
    """The parent's head start on rollout `rollout_id`'s generate task (tasks/prefetch.py), when that rollout
    generates ahead (`_generates_ahead`): the engines' calls (unless `ask_engines_after_sync` made them already),
    then the scoring and writing; with `log_probs`, its log-prob pass follows on the written file when the rollout
    trains on it (not rollout-only, no injected recording), and its train step on that file and table, so that the
    trainers go from one to the other with no round trip through this process (the rollout's train-step task takes
    that step only if its log-prob task took that pass: `start_train_step`). A chained step changes the trainers
    before the generate, save-rollout and log-prob tasks have recorded their ends; it applies what their first
    attempts produce, which a retry of any of them produces again bit for bit (seeded sampling, deterministic
    passes), and if the generation, the write or the pass fails, so does the step, before it changes anything."""
    if not _generates_ahead(cfg):
        return
    entries = train_requests(cfg, rollout_id)
    _, requests = _per_engine(cfg, entries)
    injected = injects(cfg, rollout_id)
    chain = log_probs and not cfg.rollout_only and not injected
    prefetch.start(
        cfg,
        rollout_id,
        (weights.version, weights.sha256),
        entries,
        requests,
        _rollout_path(cfg, rollout_id, injected),
        _logprobs_out(cfg, rollout_id) if chain else None,
        train=lambda rollout, table: _train_calls(cfg, rollout, table, prefetch.first_attempt(rollout_id)),
    )


def ask_engines_after_sync(cfg: RunConfig, rollout_id: int, generation: bool, evaluation: bool) -> None:
    """The parent's earlier head start on what follows rollout `rollout_id`'s sync, set before its flow run: once
    that run's sync task has the new weights in the engines (`prefetch.done`), its check task's questions to the
    engines go out, then (`evaluation`) the requests of the eval due on those weights, then (`generation`) the next
    rollout's (`prefetch.ask_engines`). An engine answers one caller's calls in order, so the check is not held
    up, and the next generation overlaps the eval's scoring, the check and the flow runs' end and start. Only the
    engines' calls: the scoring and writing wait for their tasks (the eval task, `start_next_generation` after the
    check), and if the check fails the answers are dropped. Nothing when the rollout syncs no weights
    (rollout-only, --debug-skip-weight-update) or the run does not generate ahead."""
    if not (generation or evaluation) or not _generates_ahead(cfg) or cfg.rollout_only:
        return
    if cfg.debug.debug_skip_weight_update:
        return

    def submit() -> prefetch.NextCalls:
        return prefetch.NextCalls(
            _weights_questions(actors.engines(cfg)),
            _asked_ahead(cfg, rollout_id + 1, eval_requests) if evaluation else None,
            _asked_ahead(cfg, rollout_id + 1, train_requests) if generation else None,
        )

    def ask(weights: WeightsRef) -> None:
        # submitted already if the sync was chained on the train step and put exactly these weights in
        calls = prefetch.next_calls(cfg, rollout_id, weights) or submit()
        prefetch.start_calls("check", _check_key(cfg, rollout_id, weights), prefetch.answers(calls.questions))
        weights_key = (weights.version, weights.sha256)
        for stage, asked in (("eval", calls.evaluation), ("generate", calls.generation)):
            if asked is not None:
                prefetch.ask_engines(cfg, rollout_id + 1, weights_key, asked.parts, asked.refs, stage=stage)

    prefetch.when(cfg, "sync", rollout_id, ask)
    prefetch.after_sync(cfg, rollout_id, submit)


def _asked_ahead(
    cfg: RunConfig, rollout_id: int, requests: Callable[[RunConfig, int], list[Entry]]
) -> prefetch.EngineCalls:
    """The engines' calls for rollout (or eval) `rollout_id`'s `requests`, submitted now as its first attempt's."""
    _, parts = _per_engine(cfg, requests(cfg, rollout_id))
    return prefetch.EngineCalls(parts, prefetch.engine_calls(cfg, rollout_id, parts))


def start_first_rollout(cfg: RunConfig, rollout_id: int, weights: WeightsRef, evaluation: bool) -> None:
    """The head start on the run's first rollout, `rollout_id`, as its flow run begins on the engines' `weights`
    (synced as the actors started). With `evaluation` (eval `rollout_id` comes first in that flow run), the engines
    are asked for the eval's samples; then `start_next_generation` starts the rollout's generation, with its
    log-prob pass and its train step behind it. The rollout's tasks take them as they take a later rollout's."""
    if not _generates_ahead(cfg):
        return
    if evaluation:
        _, parts = _per_engine(cfg, eval_requests(cfg, rollout_id))
        prefetch.ask_engines(cfg, rollout_id, (weights.version, weights.sha256), parts, stage="eval")
    start_next_generation(cfg, rollout_id, weights)


def _check_key(cfg: RunConfig, rollout_id: int, weights: WeightsRef) -> tuple[Any, ...]:
    return (actors.namespace(cfg), rollout_id, weights.version, weights.sha256)


def _weights_questions(engines: list[Any]) -> list[Any]:
    """The check task's questions to `engines`, submitted now: every engine's weight version, then every engine's
    weights sha256."""
    return [*[e.weight_version.remote() for e in engines], *[e.weights_sha256.remote() for e in engines]]


@task(
    name="generate",
    retries=2,
    retry_delay_seconds=1,
    cache_policy=RefCachePolicy(sections=("rollout", "data", "reward")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def generate(cfg: RunConfig, rollout_id: int, weights: WeightsRef, fresh: bool = False) -> ArtifactRef:
    """Sample `rollout_batch_size x n_samples_per_prompt` responses, score them and write
    rollout_{id}.parquet (`fresh_{id}.parquet` when a recording will be injected in its place): the engines
    generate, the rollout actor scores and writes (rollout/actor.py)."""
    entries = train_requests(cfg, rollout_id)
    _, requests = _per_engine(cfg, entries)
    path, ctx = _rollout_path(cfg, rollout_id, fresh), _ctx(rollout_id)
    weights_key = (weights.version, weights.sha256)
    started = prefetch.take(cfg, rollout_id, weights_key, requests, path) if ctx["attempt"] == 0 else None
    calls: Awaitable[prefetch.Generated] = (
        started
        if started is not None
        else prefetch.generate_rollout(cfg, entries, requests, rollout_id, weights.sha256, path, ctx)[1]
    )
    generated = await guarded(
        cfg, f"generate {rollout_id}", calls, cfg.faults.rollout_timeout, engines=True, weights=weights
    )
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
    prefetch.done(cfg, "generate", rollout_id, generated.rollout)
    return generated.rollout


@task(
    name="save-rollout",
    retries=2,
    retry_delay_seconds=1,
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
    if loaded:
        return {}
    stats = reward_stats(samples, cfg.rollout.n_samples_per_prompt)
    log_metrics(cfg, "rollout", rollout_id, stats)
    return stats


@task(
    name="log-prob",
    retries=2,
    retry_delay_seconds=1,
    cache_policy=RefCachePolicy(sections=("rollout", "train")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def log_prob(cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef) -> LogProbs:
    """Trainer log-probs (+ reference log-probs, entropy) of every response token, and their statistics. The
    first attempt takes the pass the rollout flow run started for it (`start_log_prob`), if there is one."""
    engines, trainers = actors.engines(cfg), actors.trainers(cfg)
    out = _logprobs_out(cfg, rollout_id)
    started = (
        prefetch.take_log_probs(cfg, rollout_id, rollout, weights, out)
        if _ctx(rollout_id)["attempt"] == 0
        else None
    )
    if started is None:
        await guarded(
            cfg,
            f"log-prob {rollout_id}: release engine memory",  # engines step aside for the trainer
            asyncio.gather(*[e.release_memory.remote() for e in engines]),
            cfg.faults.rollout_timeout,
            engines=True,
            weights=weights,
        )
    *refs, stats = await guarded(
        cfg,
        f"log-prob {rollout_id}",
        started if started is not None else prefetch.answers(prefetch.log_prob_calls(trainers, rollout, out)),
        cfg.faults.train_timeout,
        trainers=True,
        engines=started is not None,  # the engines' release ran in it
        weights=weights,
    )
    log_metrics(cfg, "rollout", rollout_id, stats)
    result = LogProbs(table=refs[0], stats=stats)
    prefetch.done(cfg, "log-prob", rollout_id, result)
    return result


def start_log_prob(cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef) -> None:
    """The rollout flow run's head start on its log-prob task (tasks/prefetch.py), as soon as generate returned
    `rollout`, and then on its train-step task once log-prob is done: when the rollout trains (not rollout-only)
    and --debug-sequential-stages is off."""
    if cfg.rollout_only or cfg.debug.debug_sequential_stages:
        return
    prefetch.start_log_probs(cfg, rollout_id, rollout, weights, _logprobs_out(cfg, rollout_id))
    prefetch.when(
        cfg, "log-prob", rollout_id, lambda lp: start_train_step(cfg, rollout_id, rollout, lp.table)
    )


def _logprobs_out(cfg: RunConfig, rollout_id: int) -> str:
    """Where rollout `rollout_id`'s log-prob table goes (part of a log-prob head start's key)."""
    return str(_paths(cfg).logprobs(rollout_id))


def start_train_step(cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, logprobs: ArtifactRef) -> None:
    """The head start on rollout `rollout_id`'s train-step task, on `rollout` with the log-prob table `logprobs`
    (from within the log-prob task, its own work done), and then on its sync task once train-step is done, when
    the rollout's weights go to engines (not with --debug-skip-weight-update; a train-only run generates nothing,
    so nothing starts this).

    When the run's weight transfer allows it (`transfer.chained`), the sync's calls are submitted now too, ordered
    by Ray behind every rank's step (colocated engines resume once it is done; each rank exports once it ran it,
    and only if it applied this rollout: if the step raised, nothing reaches the engines), followed on the engines
    by what the parent asked for after the sync (`ask_engines_after_sync`: the check's questions, the next rollout's
    generation): the weights reach the engines and the next generation starts with no round trip through this
    process; then the trainers write the step's snapshot (`_sync_writes_snapshot`). The sync task takes all this
    only if its train-step task got exactly that step's answers (`start_sync`)."""
    ctx = prefetch.first_attempt(rollout_id)
    # submitted already, behind the log-prob pass the parent chained on the generation, if that made `logprobs`
    calls = prefetch.chained_train(cfg, rollout_id, logprobs) or _train_calls(cfg, rollout, logprobs, ctx)
    trained = asyncio.ensure_future(prefetch.answers(calls))
    prefetch.start_calls("train-step", _train_key(cfg, rollout_id, rollout, logprobs), trained)
    if cfg.debug.debug_skip_weight_update:
        return
    transfer = chained(transfer_for(cfg))
    if transfer is not None:
        steps, engines = calls[:-1], actors.engines(cfg)
        # colocated engines take their memory back only once the trainers' step is done; others at once, so that
        # their load is waiting for the export (Ray runs one caller's calls to an engine in order)
        resumed = [e.resume_memory.remote(*(steps if cfg.placement.colocate else [])) for e in engines]
        pushed = transfer.submit(cfg, engines, rollout_id + 1, ctx, applied=rollout_id)
        # the step's snapshot, written once the weights left (the engines load and generate meanwhile)
        written = [t.write_snapshot.remote() for t in actors.trainers(cfg)]
        prefetch.chain_sync(cfg, rollout_id, trained, _after([*resumed, *written], pushed))
    prefetch.when(cfg, "train-step", rollout_id, lambda _: start_sync(cfg, rollout_id))


async def _after(first: list[Any], then: Awaitable[Pushed]) -> Pushed:
    """`then`'s answer once `first` (calls submitted before it) are answered too; all awaited at once."""
    *_, pushed = await asyncio.gather(*first, then)
    return cast(Pushed, pushed)


def _train_calls(
    cfg: RunConfig, rollout: ArtifactRef, logprobs: ArtifactRef, ctx: dict[str, int]
) -> list[Any]:
    """Every rank's train step, then rank 0's perf metrics (answered after its step), submitted now. The step-boundary
    snapshot is written by the step itself unless the weight sync writes it (`_sync_writes_snapshot`)."""
    trainers, snapshot = actors.trainers(cfg), not _sync_writes_snapshot(cfg)
    steps = [t.train_step.remote(rollout, logprobs, cfg.train_data_template, ctx, snapshot) for t in trainers]
    return [*steps, trainers[0].perf.remote()]


def _sync_writes_snapshot(cfg: RunConfig) -> bool:
    """Whether the trainers' step-boundary snapshot of a rollout is written by its weight sync, once the weights
    left for the engines (so that the next generation does not wait for it), rather than at the end of the train
    step: when a sync that moves weights follows every train step and its transfer can be chained on the step
    (`start_train_step`)."""
    return (
        not cfg.train_only
        and not cfg.rollout_only
        and not cfg.debug.debug_skip_weight_update
        and chained(transfer_for(cfg)) is not None
    )


def _train_key(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, logprobs: ArtifactRef
) -> tuple[Any, ...]:
    return (actors.namespace(cfg), rollout_id, rollout.sha256, logprobs.sha256)


@task(
    name="train-step",
    retries=1,
    retry_delay_seconds=1,
    cache_policy=RefCachePolicy(sections=("rollout", "train")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def train_step(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, logprobs: ArtifactRef, session: str
) -> list[dict]:
    """Every optimizer step of this rollout on every rank; the trainer refuses to apply a rollout twice.

    Training changes actor state, so its cache is scoped to the trainer `session` (the actors of one
    `rollflow run`): re-running a rollout flow against the same actors returns the cached metrics,
    while a fresh run with fresh actors trains for real."""
    ctx = _ctx(rollout_id)
    key = _train_key(cfg, rollout_id, rollout, logprobs)
    started = prefetch.take_calls("train-step", key) if ctx["attempt"] == 0 else None
    *per_rank, perf = await guarded(
        cfg,
        f"train-step {rollout_id}",
        started if started is not None else prefetch.answers(_train_calls(cfg, rollout, logprobs, ctx)),
        cfg.faults.train_timeout,
        trainers=True,
    )
    steps = per_rank[0]
    for m in steps:
        log_metrics(cfg, "step", rollout_id, m, step=int(m["train/step"]))
    log_metrics(cfg, "perf", rollout_id, perf)
    prefetch.done(cfg, "train-step", rollout_id, steps)
    return steps


def start_sync(cfg: RunConfig, rollout_id: int) -> None:
    """The head start on rollout `rollout_id`'s sync task (from within its train-step task, its own work done):
    the sync chained on the train step the task got (`start_train_step`), else, submitted now, the engines resume,
    then the trainers' weights go to them as version `rollout_id + 1`."""
    pushed = prefetch.synced_chain(cfg, rollout_id) or _push(
        cfg, actors.engines(cfg), rollout_id + 1, prefetch.first_attempt(rollout_id)
    )
    prefetch.start_calls("sync", (actors.namespace(cfg), rollout_id), pushed)


@task(name="sync", retries=2, retry_delay_seconds=1, log_prints=True)
async def sync(
    cfg: RunConfig,
    rollout_id: int,
    verify_equal: bool = False,
    rollout: ArtifactRef | None = None,
    logprobs: ArtifactRef | None = None,
) -> WeightsRef:
    """Push the trainer's weights to every engine as version `rollout_id + 1`.

    `verify_equal` (the weight-update checker, on the first sync): engines scramble every weight
    first, and after the sync every tensor must equal the trainer's bitwise. `rollout`, `logprobs`: what rollout
    `rollout_id`'s train step trained on; a retry after the trainers died before they wrote that step's snapshot
    (`_sync_writes_snapshot`) applies the step again from them (`_reapply`)."""
    engines = actors.engines(cfg)
    version, ctx, what = rollout_id + 1, _ctx(rollout_id), f"sync {rollout_id}"
    if ctx["attempt"] > 0 and rollout is not None and logprobs is not None:
        await _reapply(cfg, rollout_id, rollout, logprobs, ctx)
    if (
        cfg.debug.debug_skip_weight_update
    ):  # the schedule around the transfer still runs; the engines keep theirs
        before = _before_push(engines, verify_equal)
        await guarded(cfg, what, asyncio.gather(*before), cfg.faults.update_weights_timeout, engines=True)
        print(f"sync {rollout_id}: --debug-skip-weight-update: weight transfer skipped")
        return WeightsRef(
            version=await engines[0].weight_version.remote(), sha256=await engines[0].weights_sha256.remote()
        )
    started = (
        prefetch.take_calls("sync", (actors.namespace(cfg), rollout_id))
        if ctx["attempt"] == 0 and not verify_equal
        else None
    )
    pushed = await guarded(
        cfg,
        what,
        started if started is not None else _push(cfg, engines, version, ctx, scramble=verify_equal),
        cfg.faults.update_weights_timeout,
        engines=True,
        trainers=True,
    )
    if verify_equal:
        skip = {s for s in (cfg.ci.check_weight_update_skip_list or "").split(",") if s}
        held = await asyncio.gather(*[e.tensor_hashes.remote() for e in engines])
        bad = {
            i: [n for n in differing_tensors(pushed.tensor_hashes, h) if n not in skip]
            for i, h in enumerate(held)
        }
        bad = {i: names for i, names in bad.items() if names}
        log_metrics(cfg, "check", rollout_id + 1, {"check/weight_update_equal": 0.0 if bad else 1.0})
        if bad:
            raise CheckFailed("; ".join(weight_update_failure(i, names) for i, names in bad.items()))
    synced = WeightsRef(version=version, sha256=pushed.sha256)
    prefetch.done(cfg, "sync", rollout_id, synced)
    return synced


async def _reapply(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, logprobs: ArtifactRef, ctx: dict[str, int]
) -> None:
    """A retried sync of rollout `rollout_id`: if the trainers were re-created from the snapshot before that
    rollout's step (they died after the step, before its snapshot was written: `_sync_writes_snapshot`), apply the
    step again on its recorded rollout and log-prob table, which gives the same weights bit for bit (a
    deterministic trainer, from the restored weights, optimizer and RNG). Trainers anywhere else are an error."""
    trainers, what = actors.trainers(cfg), f"sync {rollout_id}"
    health = await guarded(
        cfg,
        what,
        asyncio.gather(*[t.health.remote() for t in trainers]),
        cfg.faults.train_timeout,
        trainers=True,
    )
    at = {int(h["last_applied_rollout"]) for h in health}
    if at == {rollout_id}:
        return
    if at != {rollout_id - 1}:
        raise RuntimeError(
            f"{what}: the trainers hold rollouts {sorted(at)}, not {rollout_id} (or {rollout_id - 1}, to apply its "
            "step again): their state cannot be restored here; resume the run with --resume"
        )
    notify.notice(
        f"{what}: the trainers were restored to rollout {rollout_id - 1} (they died before writing rollout "
        f"{rollout_id}'s snapshot); applying rollout {rollout_id}'s step again from its recorded rollout and "
        "log-probs",
        logging.WARNING,  # as the recovery that made it necessary is reported
    )
    await guarded(
        cfg,
        what,
        asyncio.gather(
            *[t.train_step.remote(rollout, logprobs, cfg.train_data_template, ctx, True) for t in trainers]
        ),
        cfg.faults.train_timeout,
        trainers=True,
    )


def _before_push(engines: list, scramble: bool) -> list:
    """The engines' calls before a weight transfer, submitted now: snapshot and scramble (the weight-update
    checker), then resume. An engine runs the calls of one caller in submission order (snapshot, resume,
    update), so they are submitted together and awaited once."""
    return [
        *([e.snapshot_and_scramble.remote() for e in engines] if scramble else []),
        *[e.resume_memory.remote() for e in engines],
    ]


def _push(
    cfg: RunConfig, engines: list, version: int, ctx: dict, scramble: bool = False
) -> Coroutine[Any, Any, Pushed]:
    """The engines' calls before the transfer (`_before_push`), submitted as this is called; awaited, the transfer's
    calls go out too and the trainers' weights go into the engines as `version` (each engine takes them after the
    calls before: Ray runs one caller's calls to an actor in order), then the trainers write the step-boundary
    snapshot if the sync writes it (`_sync_writes_snapshot`)."""
    before = _before_push(engines, scramble)
    # the transfer's calls go out at once: an engine takes them after the ones before (same caller, in order)
    pushing = _after(before, transfer_for(cfg).push(cfg, engines, version, ctx))
    if not _sync_writes_snapshot(cfg):
        return pushing

    async def then_snapshot() -> Pushed:
        pushed = await pushing
        await asyncio.gather(*[t.write_snapshot.remote() for t in actors.trainers(cfg)])
        return pushed

    return then_snapshot()


@task(name="check", log_prints=True)
async def check(
    cfg: RunConfig,
    rollout_id: int,
    steps: list[dict],
    weights: WeightsRef | None,
    logprob_stats: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Invariants of one rollout: finite metrics; every engine holds the trainer's weights
    (`weights` is None when nothing was synced: rollout-only and train-only runs); with --ci-test, the KL,
    log-prob (on `logprob_stats`, the log-prob stage's statistics) and grad-norm checkers."""
    bad = [f"step {m.get('train/step')}: {k}" for m in steps for k in non_finite(m)]
    if bad:
        raise RuntimeError(f"rollout {rollout_id}: non-finite training metrics: {bad}")
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
        result = {"check/finite_metrics": 1.0}
        log_metrics(cfg, "check", rollout_id, result)
        return result
    engines = actors.engines(cfg)
    started = prefetch.take_calls("check", _check_key(cfg, rollout_id, weights))
    answers = await guarded(
        cfg,
        f"check {rollout_id}",
        started if started is not None else prefetch.answers(_weights_questions(engines)),
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
        raise RuntimeError(await _out_of_sync(cfg, rollout_id, weights, wrong, versions, shas))
    result = {
        "check/finite_metrics": 1.0,
        "check/engines_in_sync": 1.0,
        "check/weight_version": weights.version,
    }
    log_metrics(cfg, "check", rollout_id, result)
    return result


async def _out_of_sync(
    cfg: RunConfig, rollout_id: int, weights: WeightsRef, wrong: list[int], versions: list, shas: list
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
    return out_of_sync_message(rollout_id, weights.version, weights.sha256, states, hashes[0])


async def _trainer_hashes(cfg: RunConfig) -> dict[str, str]:
    return (await trainer_weights(cfg)).tensor_hashes


def artifact_slug(name: str) -> str:
    """A run name as Prefect artifact keys allow it (lowercase letters, digits, dashes)."""
    return name.lower().replace("_", "-").replace(".", "-")


def _ci_violations(
    cfg: RunConfig, rollout_id: int, steps: list[dict], stats: dict[str, float]
) -> list[Violation]:
    """The --ci-test checkers that live in the check task (KL, log-probs, grad norm)."""
    ci, out = cfg.ci, []
    if ci.ci_test and not ci.ci_disable_kl_checker:
        out += kl_checker(
            steps, rollout_id, first_step_of_run=0, recomputed_old=not cfg.train.use_rollout_logprobs
        )
    if ci.ci_test and not ci.ci_disable_logprobs_checker and not cfg.rollout_only:
        out += logprob_checker(
            stats, rollout_id, rollout_id == 0, ci.ci_logprobs_checker_abs_tol, ci.ci_entropy_max
        )
    if ci.ci_save_grad_norm or ci.ci_load_grad_norm:
        out += grad_norm_checker(cfg, steps, rollout_id)
    return out


@task(
    name="eval",
    retries=2,
    retry_delay_seconds=1,
    cache_policy=RefCachePolicy(sections=("rollout", "eval", "data", "reward")),
    persist_result=True,
    result_serializer="json",
    log_prints=True,
)
async def evaluate(cfg: RunConfig, eval_id: int, weights: WeightsRef) -> dict[str, float]:
    """Every --eval-prompt-data dataset with the weights of version `eval_id`: `eval/NAME` (mean reward) and
    `eval/NAME-truncated_ratio`, one generation over all datasets, written to eval_{id}.parquet."""
    src = rollout_source(cfg)
    entries = eval_requests(cfg, eval_id)
    path, ctx = str(_paths(cfg).eval_rollout(eval_id)), _ctx(eval_id)
    _, requests = _per_engine(cfg, entries)
    weights_key = (weights.version, weights.sha256)
    asked = prefetch.take_asked(cfg, "eval", eval_id, weights_key, requests) if ctx["attempt"] == 0 else None
    _, generated = prefetch.generate_rollout(
        cfg, entries, requests, eval_id, weights.sha256, path, ctx, eval_mode=True, asked=asked
    )
    ref = (
        await guarded(
            cfg, f"eval {eval_id}", generated, cfg.faults.rollout_timeout, engines=True, weights=weights
        )
    ).rollout
    samples = read_rollout(ref)
    record_rollout(cfg, f"eval_{eval_id}", samples)
    metrics = eval_stats(samples, [name for name, _ in src.evals])
    log_metrics(cfg, "eval", eval_id, {**metrics, "eval/step": eval_id})
    return metrics


@task(name="save", log_prints=True)
async def save_checkpoint(cfg: RunConfig, rollout_id: int) -> str:
    """Write iter_{rollout_id:07d}/ under --save (rank 0 writes; all ranks hold the same weights)."""
    ctx = _ctx(rollout_id)
    await guarded(
        cfg,
        f"save {rollout_id}",
        asyncio.gather(*[t.save.remote(cfg.checkpoint.save, rollout_id, ctx) for t in actors.trainers(cfg)]),
        cfg.faults.train_timeout,
        trainers=True,
    )
    print(f"saved checkpoint iter_{rollout_id:07d} to {cfg.checkpoint.save}")
    return str(cfg.checkpoint.save)
