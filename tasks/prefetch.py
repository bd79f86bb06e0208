"""Head starts: a stage's actor calls started before its task runs, so that the actors work while Prefect
records the task runs in between (a few ms of client and server work per task run, and several API round trips
between two flow runs, with the actors idle otherwise). Each stage's calls start as soon as what they need is
there:

- generation: the engines are asked for rollout N+1's samples as soon as rollout N's sync task has put the new
  weights in them (`ask_engines`: behind rollout N's check's own questions to the engines, and behind the requests
  of the eval due on those weights, which its eval task takes: `take_asked`), and the rollout actor is asked to
  score and write them (rollout/actor.py) once the body of rollout N's flow run returns (its weights synced and
  checked), while Prefect records that run's end and starts the next. The run's first rollout asks for its eval
  and its generation as its flow run begins;
- log-probs: the trainers' log-prob pass (after the engines' memory release, as the task orders them) follows on
  the written file through Ray: the parent submits it with the generation (`start`; not when the trainers save a
  checkpoint first), the train step behind it (`chained_train`), and the rollout's generate task hands it to its
  log-prob task once it has the file's ref (`start_log_probs`), or starts it then if nothing was chained or the
  chain ran on another file. The calls go out at once, ordered by Ray rather than by an await (`log_prob_calls`);
- the train step, once the log-prob task has its table, and the weight sync, once the train-step task has
  every rank's metrics: each while Prefect records the task before it and starts its own. Where the weight
  transfer allows it (tasks/transfer.FullTransfer.submit), the sync's calls are submitted with the train step, ordered
  by Ray behind it, and the check's questions and the next rollout's generation behind the transfer
  (`chain_sync`): the new weights reach the engines and the next generation begins with no round trip through the
  orchestrating process. The sync task takes that chain only if its train-step task got exactly the answers of
  the step it followed (`synced_chain`), and the check and the next generate task take the calls behind it only if
  it put exactly the synced weights in (`next_calls`); otherwise each asks afresh.

A stage that others wait for says so from within its task, before Prefect records the task's end
(`when` / `done`); a stage whose calls change actor state or write files (train-step, sync, a rollout's scoring and
writing) is started only once the task before it has done all its own work, so a head start never runs ahead of a
task that could still fail on its own. The chained train step and sync are the exceptions, and safe
ones: the step runs on what the generation, the write and the pass produced (if one of them failed, Ray fails the step before it runs), which
a retry of their tasks produces again bit for bit (seeded sampling, deterministic passes); the sync's calls run only
once the trainers applied the step (if the step failed, the export raises and no weights move), and what they put in
the engines is the trainers' weights after that step, which a retried train-step task leaves as they are (the
trainers apply a rollout once). The engines' generation alone changes neither (their answers are dropped if
rollout N's check fails). Nothing computed changes: sampling is seeded per sample, so a request gives the same
tokens whenever it runs on the same weights, and every call is the one the task's first attempt would make. A head
start is used only by the first attempt of the task it was started for (same run actors, rollout, weights,
inputs); anything else (a retry, a cached task, a run that ends first) drops it. An error an actor raised
surfaces in that task, as if it had asked (its retry then asks afresh). `--debug-sequential-stages` turns them all
off: every actor call is then made inside its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from artifacts.store import ArtifactRef
from config import RunConfig
from engines.base import GenerateRequest
from rollout.finish import Tally
from rollout.requests import Entry
from tasks import actors
from tasks.refs import WeightsRef


@dataclass(frozen=True)
class Generated:
    """A generated rollout: its file's ref, its tally, and the seconds the longest engine spent generating it."""

    rollout: ArtifactRef
    tally: Tally
    seconds: float


def generate_rollout(
    cfg: RunConfig,
    entries: list[Entry],
    parts: list[list[GenerateRequest]],
    rollout_id: int,
    weights_sha256: str,
    path: str,
    ctx: dict[str, Any],
    eval_mode: bool = False,
    asked: list[Any] | None = None,
) -> tuple[Any, Coroutine[Any, Any, Generated]]:
    """Submit now: each engine's part of `entries` (requests `parts`; `asked`: the object refs of those calls, if
    they were made already), then the rollout actor scores their answers and writes the rollout (an eval set with
    `eval_mode`) to `path` (rollout/actor.py). Returns the object ref of the written file's ref (to pass on to other
    actor calls) and the awaitable `Generated`."""
    answers = asked if asked is not None else _ask_engines(cfg, parts, ctx)
    finish = actors.rollout_actor(cfg).finish_rollout
    ref, tally = finish.remote(
        cfg, rollout_id, entries, weights_sha256, path, *answers, eval_mode=eval_mode, ctx=ctx
    )

    async def generated() -> Generated:
        rollout, counted = await asyncio.gather(ref, tally)
        return Generated(rollout, counted, counted.generation)

    return ref, generated()


def _ask_engines(cfg: RunConfig, parts: list[list[GenerateRequest]], ctx: dict[str, Any]) -> list[Any]:
    """Each engine's `generate` call on its part of a rollout's requests, submitted now: one object ref per
    non-empty part."""
    engines = actors.engines(cfg)
    return [engine.generate.remote(part, ctx) for engine, part in zip(engines, parts, strict=True) if part]


def log_prob_calls(trainers: list[Any], rollout: Any, out: str, after: list[Any] | None = None) -> list[Any]:
    """Every trainer rank's log-prob pass over `rollout` (an ArtifactRef or the object ref of one), written to
    `out` by rank 0, then rank 0's trainer-side rollout stats, submitted now: [ref per rank (rank 0's the written
    log-prob table, None elsewhere)..., stats].
    `after`: object refs of calls the passes must follow; Ray runs them once those are done, with no await in the
    caller (whose event loop a task's own work may hold for tens of ms)."""
    written = [t.compute_log_probs.remote(rollout, out, *(after or [])) for t in trainers]
    # rank 0 runs its calls in submission order and Ray hands it the ref it wrote: no round trip between
    return [*written, trainers[0].rollout_stats.remote(rollout, written[0])]


async def answers(refs: list[Any]) -> list[Any]:
    """The answers to the calls `refs`, in order."""
    return list(await asyncio.gather(*refs))


@dataclass
class _Started:
    key: tuple[Any, ...]
    answers: asyncio.Future[Any]
    on: asyncio.Future[Generated] | None = None  # a chained log-prob pass: the generation it runs on
    then: list[Any] | None = None  # a chained log-prob pass: the train step's calls submitted behind it


_started: dict[str, _Started] = {}  # by stage: at most one head start each


def first_attempt(rollout_id: int) -> dict[str, int]:
    """The context a stage's first attempt passes its actors' fault hooks (`tasks.stages._ctx` at attempt 0)."""
    return {"rollout_id": rollout_id, "attempt": 0}


def start_calls(stage: str, key: tuple[Any, ...], calls: Any) -> None:
    """Head start `stage` with `calls` (an awaitable of what the stage's first attempt would get from its
    actors), for the inputs `key`; replaces the stage's head start before."""
    _drop(stage)
    _started[stage] = _Started(key, asyncio.ensure_future(calls))


def take_calls(stage: str, key: tuple[Any, ...]) -> asyncio.Future[Any] | None:
    """`stage`'s head start if it was started for exactly `key` (None otherwise), at most once."""
    started = _started.pop(stage, None)
    if started is None:
        return None
    if started.key != key:
        _discard(started)
        return None
    return started.answers


def _drop(stage: str) -> None:
    started = _started.pop(stage, None)
    if started is not None:
        _discard(started)


def _weights_key(cfg: RunConfig, rollout_id: int, version: int, sha256: str) -> tuple[str, int, int, str]:
    return (actors.namespace(cfg), rollout_id, version, sha256)


@dataclass(frozen=True)
class _Asked:
    key: tuple[Any, ...]
    answers: list[Any]  # object refs of the engines' calls


# "generate": the next rollout's engine calls, made before `start`; "eval": an eval's, taken by its task
_asked: dict[str, _Asked] = {}


def ask_engines(
    cfg: RunConfig,
    rollout_id: int,
    weights: tuple[int, str],
    parts: list[list[GenerateRequest]],
    asked: list[Any] | None = None,
    stage: str = "generate",
) -> None:
    """Ask the engines, holding `weights` (version, sha256), for rollout `rollout_id`'s samples (one list of
    requests per engine in `parts`) now, as its first generate attempt would: only the engines' calls, which write
    nothing and change no weights. `start` has their answers scored and written if it is called for the same
    rollout, weights and requests; they are dropped otherwise. `asked`: those calls' object refs, if they were
    submitted already (`engine_calls`, behind the transfer of these weights). `stage="eval"`: eval `rollout_id`'s
    samples instead, taken by its eval task (`take_asked`)."""
    _asked[stage] = _Asked(
        (*_weights_key(cfg, rollout_id, *weights), parts),
        asked if asked is not None else engine_calls(cfg, rollout_id, parts),
    )


def take_asked(
    cfg: RunConfig, stage: str, rollout_id: int, weights: tuple[int, str], parts: list[list[GenerateRequest]]
) -> list[Any] | None:
    """The object refs of the engine calls `ask_engines` made for `stage` if they were made for exactly this
    rollout (or eval) id, weights and requests; None otherwise. At most once."""
    asked = _asked.pop(stage, None)
    return (
        asked.answers
        if asked is not None and asked.key == (*_weights_key(cfg, rollout_id, *weights), parts)
        else None
    )


def engine_calls(cfg: RunConfig, rollout_id: int, parts: list[list[GenerateRequest]]) -> list[Any]:
    """Rollout `rollout_id`'s generate calls to the engines (one list of requests per engine in `parts`), as its
    first attempt would make them, submitted now; their object refs."""
    return _ask_engines(cfg, parts, first_attempt(rollout_id))


@dataclass(frozen=True)
class EngineCalls:
    """One generation asked of the engines ahead: each engine's requests (`parts`) and its calls' object refs."""

    parts: list[list[GenerateRequest]]
    refs: list[Any]


@dataclass(frozen=True)
class NextCalls:
    """The engine calls that follow a sync, submitted behind its transfer: the check's questions, then the eval due
    on the synced weights, then the next rollout's generation (each None if there is none)."""

    questions: list[Any]
    evaluation: EngineCalls | None
    generation: EngineCalls | None


@dataclass
class _SyncChain:
    """Rollout `key[1]`'s sync submitted with its train step (tasks/stages.start_train_step)."""

    key: tuple[str, int]
    trained: asyncio.Future[Any]  # the train step's answers
    pushed: asyncio.Future[Any]  # the sync's, behind the engines' resume
    then: NextCalls | None  # the engines' calls behind the transfer, if the parent asked for them


# "sync": the chain made with the last train step; "next": the one its sync task took
_chained: dict[str, _SyncChain] = {}
# "next": ((run namespace, rollout id), how to submit the engine calls that follow that rollout's sync), the parent's
_after_sync: dict[str, tuple[tuple[str, int], Callable[[], NextCalls]]] = {}


def after_sync(cfg: RunConfig, rollout_id: int, submit: Callable[[], NextCalls]) -> None:
    """The engines' calls to make once rollout `rollout_id`'s sync has the new weights in them: `submit`, behind the
    transfer, if that sync is chained on the train step (`chain_sync`); replaces the one asked for before."""
    _after_sync["next"] = ((actors.namespace(cfg), rollout_id), submit)


def chain_sync(
    cfg: RunConfig,
    rollout_id: int,
    trained: asyncio.Future[Any],
    pushed: Awaitable[Any],
) -> None:
    """Rollout `rollout_id`'s sync, submitted behind its train step (`trained`: the step's answers; `pushed`: the
    sync's), and then the engines' calls `after_sync` asked for, submitted now behind it. Taken by `synced_chain`."""
    key = (actors.namespace(cfg), rollout_id)
    asked = _after_sync.pop("next", None)
    _drop_chain("sync")
    _chained["sync"] = _SyncChain(
        key,
        trained,
        asyncio.ensure_future(pushed),
        asked[1]() if asked is not None and asked[0] == key else None,
    )


def synced_chain(cfg: RunConfig, rollout_id: int) -> asyncio.Future[Any] | None:
    """The sync chained on rollout `rollout_id`'s train step, once that step is done, if it ran on exactly the step
    the train-step task got (its head start's answers, without error); None otherwise (the caller pushes itself).
    At most once."""
    chain = _chained.pop("sync", None)
    if chain is None:
        return None
    trained = chain.trained
    if chain.key != (actors.namespace(cfg), rollout_id) or not _succeeded(trained):
        _discard_chain(chain)
        return None
    _drop_chain("next")
    _chained["next"] = chain
    return chain.pushed


def next_calls(cfg: RunConfig, rollout_id: int, weights: WeightsRef) -> NextCalls | None:
    """The engine calls submitted behind rollout `rollout_id`'s chained sync, if that sync put exactly `weights`
    (version rollout_id + 1, its sha256) into the engines and they were asked for; None otherwise. At most once."""
    chain = _chained.pop("next", None)
    if chain is None:
        return None
    pushed = chain.pushed
    if (
        chain.key != (actors.namespace(cfg), rollout_id)
        or chain.then is None
        or weights.version != rollout_id + 1
        or not _succeeded(pushed)
        or pushed.result().sha256 != weights.sha256
    ):
        _discard_chain(chain)
        return None
    return chain.then


def _succeeded(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _drop_chain(slot: str) -> None:
    chain = _chained.pop(slot, None)
    if chain is not None:
        _discard_chain(chain)


def _discard_chain(chain: _SyncChain) -> None:
    """Forget a chain nobody uses."""
    then, refs = chain.then, [chain.pushed]
    if then is not None:
        refs += [
            *then.questions,
            *[r for c in (then.evaluation, then.generation) if c is not None for r in c.refs],
        ]
    _forget(refs)


def _forget(refs: list[Any]) -> None:
    """Answers nobody will read: a future's is retrieved (an actor error there belongs to no stage) or it is
    cancelled; Ray's object refs are left to Ray."""
    for ref in refs:
        if isinstance(ref, asyncio.Future):
            if not ref.done():
                ref.cancel()
            elif not ref.cancelled():
                ref.exception()


def start(
    cfg: RunConfig,
    rollout_id: int,
    weights: tuple[int, str],
    entries: list[Entry],
    parts: list[list[GenerateRequest]],
    path: str,
    log_probs_out: str | None = None,
    train: Callable[[Any, Any], list[Any]] | None = None,
) -> None:
    """Generate rollout `rollout_id` (`entries`, one list of requests per engine in `parts`) and write it to `path`
    as its first generate attempt would, on the engines' `weights` (version, sha256); replaces a generation
    started before. `log_probs_out`: also chain the log-prob pass on the written file (the engines step aside
    first), as the rollout's log-prob task would start it (`start_log_probs` takes it if it is for the same
    file); `train`: then the train step on the written file and table, submitted now by `train(rollout's object
    ref, table's object ref)` (its calls' object refs), taken by `chained_train`."""
    version, sha256 = weights
    key = (*_weights_key(cfg, rollout_id, version, sha256), parts, path)
    ref, generated = generate_rollout(
        cfg,
        entries,
        parts,
        rollout_id,
        sha256,
        path,
        first_attempt(rollout_id),
        asked=take_asked(cfg, "generate", rollout_id, weights, parts),
    )
    start_calls("generate", key, generated)
    _drop("chained-log-prob")
    if log_probs_out is not None:
        chain = (*_weights_key(cfg, rollout_id, version, sha256), log_probs_out)
        calls = _log_prob_pass(cfg, ref, log_probs_out)
        _started["chained-log-prob"] = _Started(
            chain,
            asyncio.ensure_future(answers(calls)),
            _started["generate"].answers,
            train(ref, calls[0]) if train is not None else None,
        )


def take(
    cfg: RunConfig, rollout_id: int, weights: tuple[int, str], parts: list[list[GenerateRequest]], path: str
) -> asyncio.Future[Generated] | None:
    """The generation started for exactly this rollout, weights, requests and file (None otherwise); each start
    is taken at most once."""
    return take_calls("generate", (*_weights_key(cfg, rollout_id, *weights), parts, path))


def start_log_probs(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef, out: str
) -> None:
    """Start rollout `rollout_id`'s log-prob pass over `rollout` (written to `out`) as its log-prob task's first
    attempt would, the engines holding `weights`; replaces a pass started before. The pass chained on this
    rollout's generation (`start`) is taken instead, if it runs on this very file."""
    key = _log_prob_key(cfg, rollout_id, rollout, weights, out)
    chained = _started.pop("chained-log-prob", None)
    _drop_train()
    if chained is not None:
        if chained.key == (*_weights_key(cfg, rollout_id, weights.version, weights.sha256), out) and _wrote(
            chained.on, rollout
        ):
            start_calls("log-prob", key, chained.answers)
            if chained.then is not None:  # the pass's answers stay the log-prob task's to take
                _trains["train"] = ((actors.namespace(cfg), rollout_id), chained.answers, chained.then)
            return
        _discard(chained)
    start_calls("log-prob", key, answers(_log_prob_pass(cfg, rollout, out)))


def chained_train(cfg: RunConfig, rollout_id: int, logprobs: ArtifactRef) -> list[Any] | None:
    """The train step's calls submitted behind rollout `rollout_id`'s chained log-prob pass (`start`), if the
    rollout's log-prob task took that pass and it wrote exactly the table `logprobs`; None otherwise (the caller
    submits its own). At most once."""
    chained = _trains.pop("train", None)
    if chained is None:
        return None
    key, table, calls = chained
    if key != (actors.namespace(cfg), rollout_id) or not _succeeded(table) or table.result()[0] != logprobs:
        _forget(calls)
        return None
    return calls


# "train": (run namespace, rollout id), the chained log-prob pass's answers, the train step's calls behind it
_trains: dict[str, tuple[tuple[str, int], asyncio.Future[Any], list[Any]]] = {}


def _drop_train() -> None:
    chained = _trains.pop("train", None)
    if chained is not None:
        _forget(chained[2])


def _log_prob_pass(cfg: RunConfig, rollout: Any, out: str) -> list[Any]:
    """The trainers' log-prob pass over `rollout` (an ArtifactRef, or the object ref of one still being written),
    submitted now behind the engines' memory release (the engines step aside first): `log_prob_calls`'s refs."""
    released = [e.release_memory.remote() for e in actors.engines(cfg)]
    return log_prob_calls(actors.trainers(cfg), rollout, out, after=released)


def _wrote(generation: asyncio.Future[Generated] | None, rollout: ArtifactRef) -> bool:
    """Whether `generation` has finished and wrote exactly `rollout`."""
    return (
        generation is not None
        and generation.done()
        and not generation.cancelled()
        and generation.exception() is None
        and generation.result().rollout == rollout
    )


def take_log_probs(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef, out: str
) -> asyncio.Future[list[Any]] | None:
    """The pass started for exactly this rollout artifact, weights and output (None otherwise), at most once:
    the answers of `log_prob_calls`."""
    return take_calls("log-prob", _log_prob_key(cfg, rollout_id, rollout, weights, out))


def _log_prob_key(
    cfg: RunConfig, rollout_id: int, rollout: ArtifactRef, weights: WeightsRef, out: str
) -> tuple[Any, ...]:
    return (*_weights_key(cfg, rollout_id, weights.version, weights.sha256), rollout.sha256, out)


# (run namespace, stage, rollout id) -> what to call once that rollout's stage has its result
_when: dict[tuple[str, str, int], Callable[[Any], None]] = {}


def when(cfg: RunConfig, stage: str, rollout_id: int, callback: Callable[[Any], None]) -> None:
    """Call `callback(result)` once rollout `rollout_id`'s `stage` has its result (`done`), at most once: from
    within the stage's task (its first attempt that gets there), before Prefect records the task's end."""
    _when[(actors.namespace(cfg), stage, rollout_id)] = callback


def done(cfg: RunConfig, stage: str, rollout_id: int, result: Any) -> None:
    """Rollout `rollout_id`'s `stage` has `result` (its task made it, or a cached task returned it): the callback
    registered for it runs, if it has not run yet."""
    callback = _when.pop((actors.namespace(cfg), stage, rollout_id), None)
    if callback is not None:
        callback(result)


def drop() -> None:
    """Forget every head start nobody took (the actors finish them; their answers are ignored)."""
    for stage in list(_started):
        _drop(stage)
    for slot in list(_chained):
        _drop_chain(slot)
    _drop_train()
    _when.clear()
    _asked.clear()
    _after_sync.clear()


def _discard(started: _Started) -> None:
    _forget([started.answers, *(started.then or [])])
