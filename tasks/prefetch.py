"""Head starts: a stage's actor calls started before its task runs, so that the actors work while Prefect
records the task runs in between (a few ms of client and server work per task run, and several API round trips
between two flow runs, with the actors idle otherwise). Each stage's calls start as soon as what they need is
there:

- generation: the engines are asked for rollout N+1's samples as soon as rollout N's sync task has put the new
  weights in them (`ask_engines`: behind rollout N's check's own questions to the engines), and the rollout actor
  is asked to score and write them (rollout/actor.py) once the body of rollout N's flow run returns (its weights
  synced and checked), while Prefect records that run's end and starts the next;
- log-probs: the trainers' log-prob pass (after the engines' memory release, as the task orders them) follows on
  the written file through Ray: the parent submits it with the generation (`start`; not when the trainers save a
  checkpoint first), and the rollout's generate task hands it to its log-prob task once it has the file's ref
  (`start_log_probs`), or starts it then if nothing was chained or the chain ran on another file. The calls go
  out at once, ordered by Ray rather than by an await (`log_prob_calls`);
- the train step, once the log-prob task has its table, and the weight sync, once the train-step task has
  every rank's metrics: each while Prefect records the task before it and starts its own.

A stage that others wait for says so from within its task, before Prefect records the task's end
(`when` / `done`); a stage whose calls change actor state or write files (train-step, sync, a rollout's scoring and
writing) is started only once the task before it has done all its own work, so a head start never runs ahead of a
task that could still fail on its own. The engines' generation alone changes neither (their answers are dropped if
rollout N's check fails). Nothing computed changes: sampling is seeded per sample, so a request gives the same
tokens whenever it runs on the same weights, and every call is the one the task's first attempt would make. A head
start is used only by the first attempt of the task it was started for (same run actors, rollout, weights,
inputs); anything else (a retry, a cached task, a run that ends first) drops it. An error an actor raised
surfaces in that task, as if it had asked (its retry then asks afresh). `--debug-sequential-stages` turns them all
off: every actor call is then made inside its own task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
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


_asked: dict[str, _Asked] = {}  # "generate": the next rollout's engine calls, made before `start`


def ask_engines(
    cfg: RunConfig, rollout_id: int, weights: tuple[int, str], parts: list[list[GenerateRequest]]
) -> None:
    """Ask the engines, holding `weights` (version, sha256), for rollout `rollout_id`'s samples (one list of
    requests per engine in `parts`) now, as its first generate attempt would: only the engines' calls, which write
    nothing and change no weights. `start` has their answers scored and written if it is called for the same
    rollout, weights and requests; they are dropped otherwise."""
    _asked["generate"] = _Asked(
        (*_weights_key(cfg, rollout_id, *weights), parts), _ask_engines(cfg, parts, first_attempt(rollout_id))
    )


def start(
    cfg: RunConfig,
    rollout_id: int,
    weights: tuple[int, str],
    entries: list[Entry],
    parts: list[list[GenerateRequest]],
    path: str,
    log_probs_out: str | None = None,
) -> None:
    """Generate rollout `rollout_id` (`entries`, one list of requests per engine in `parts`) and write it to `path`
    as its first generate attempt would, on the engines' `weights` (version, sha256); replaces a generation
    started before. `log_probs_out`: also chain the log-prob pass on the written file (the engines step aside
    first), as the rollout's log-prob task would start it (`start_log_probs` takes it if it is for the same
    file)."""
    version, sha256 = weights
    # what `ask_engines` keys its calls by
    on_engines = (*_weights_key(cfg, rollout_id, version, sha256), parts)
    key = (*on_engines, path)
    asked = _asked.pop("generate", None)
    ref, generated = generate_rollout(
        cfg,
        entries,
        parts,
        rollout_id,
        sha256,
        path,
        first_attempt(rollout_id),
        asked=asked.answers if asked is not None and asked.key == on_engines else None,
    )
    start_calls("generate", key, generated)
    _drop("chained-log-prob")
    if log_probs_out is not None:
        chain = (*_weights_key(cfg, rollout_id, version, sha256), log_probs_out)
        _started["chained-log-prob"] = _Started(
            chain,
            asyncio.ensure_future(_log_prob_pass(cfg, ref, log_probs_out)),
            _started["generate"].answers,
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
    if chained is not None:
        if chained.key == (*_weights_key(cfg, rollout_id, weights.version, weights.sha256), out) and _wrote(
            chained.on, rollout
        ):
            start_calls("log-prob", key, chained.answers)
            return
        _discard(chained)
    start_calls("log-prob", key, _log_prob_pass(cfg, rollout, out))


def _log_prob_pass(cfg: RunConfig, rollout: Any, out: str) -> Coroutine[Any, Any, list[Any]]:
    """The trainers' log-prob pass over `rollout` (an ArtifactRef, or the object ref of one still being written),
    submitted now behind the engines' memory release (the engines step aside first); awaits `log_prob_calls`'s
    answers."""
    released = [e.release_memory.remote() for e in actors.engines(cfg)]
    return answers(log_prob_calls(actors.trainers(cfg), rollout, out, after=released))


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
    _when.clear()
    _asked.clear()


def _discard(started: _Started) -> None:
    if started.answers.done():
        if not started.answers.cancelled():
            started.answers.exception()  # retrieved: an actor error here belongs to no stage
    else:
        started.answers.cancel()
