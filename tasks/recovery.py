"""Surviving a dead or hung actor. Every stage awaits its actor calls through `guarded`, which bounds them by
the stage's timeout. When an actor died or hung, it replaces the actors involved before the stage fails. So
Prefect's retry of the stage runs on healthy actors holding the right weights.

- An engine is re-created under its name and given the trainer's current weights as the version the stage
  expects (checked by sha256). Sampling is seeded per sample, so the retried stage produces the same samples,
  and the run stays bitwise identical to a fault-free one.
- The trainers are re-created together (one dead rank breaks the gloo group). They load their latest
  step-boundary snapshot (trainers/actor.py), or the run's starting weights before the first train-step. The
  apply-once guard travels in the snapshot, so a retried train-step of an applied rollout returns its metrics.
  A rollout's train step writes its snapshot before the step's task ends. Trainers that die before that fail
  the task and come back at the rollout before; the retried task applies the step again.
- The rollout actor (it scores and writes what the engines generate) keeps nothing between calls: Ray restarts
  a dead one by itself, and one that hangs is re-created; the retried stage sends it the engines' answers again.
- A fault that raised inside a live actor (an exception, not a death) needs no replacement: the retry runs
  on the same actor. A checker failure is never retried (tasks/checks.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import ray

from artifacts.checkpoints import latest_checkpoint
from config import RunConfig
from tasks import actors
from tasks.notify import notice
from tasks.refs import WeightsRef

T = TypeVar("T")


class ActorLost(RuntimeError):
    """A stage's actor died or hung; it was replaced, and the stage fails so that Prefect retries it (while the
    stage has retries left)."""


_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.ObjectLostError)


async def guarded(
    cfg: RunConfig,
    what: str,
    call: Awaitable[T],
    timeout: float | None,
    *,
    engines: bool = False,
    trainers: bool = False,
    weights: WeightsRef | None = None,
) -> T:
    """Await `call` within `timeout` seconds. On an actor death or a timeout, replace the `engines` and/or
    `trainers` that do not answer (engines then hold `weights`, when given) and raise ActorLost naming the
    stage, the cause and whether the stage will be retried."""
    try:
        return await asyncio.wait_for(call, timeout)
    except TimeoutError:
        cause = f"no answer within {timeout:g} s"
    except ray.exceptions.RayTaskError as e:  # a live actor raised; lost only if what it waited for was lost
        if not isinstance(e.cause, _LOST):
            raise unwrapped(e) from None
        cause = f"{type(e.cause).__name__}: {_first_line(e.cause)}"
    except _LOST as e:
        cause = f"{type(e).__name__}: {_first_line(e)}"
    replaced = []
    if trainers and await _unhealthy(actors.trainers(cfg)):
        await restart_trainers(cfg)
        replaced.append("the trainers")
    if engines:
        dead = await _unhealthy(actors.engines(cfg))
        if dead:
            await restart_engines(cfg, dead, weights)
            replaced.append(f"engines {dead}")
        # the engines' companion: Ray brings a dead one back by itself, a hung one is replaced here
        if not cfg.train_only and await _unhealthy([actors.rollout_actor(cfg)]):
            await actors.restart_rollout_actor(cfg)
            replaced.append("the rollout actor")
    done = f"replaced {' and '.join(replaced)}" if replaced else "every actor answers"
    line = f"{what}: {cause}; {done}; {retry_outlook(cfg.faults.task_retries, actors.task_attempt())}"
    notice(line, logging.WARNING)
    raise ActorLost(line)


def retry_outlook(retries: int, attempt: int | None) -> str:
    """Whether a stage that fails now on attempt `attempt` (0, 1, ...; None: not a Prefect task run) is run again,
    given `--task-retries` `retries`: every stage task runs under that policy (flows/stages.py), and ActorLost is
    never excluded from it."""
    if attempt is None:
        return "the stage will not be retried (it does not run as a Prefect task)"
    if attempt < retries:
        return f"the stage will be retried (attempt {attempt + 2} of {retries + 1})"
    return f"the stage will not be retried (attempt {attempt + 1} of {retries + 1} failed; --task-retries {retries})"


async def _unhealthy(handles: list[Any], timeout: float = 10.0) -> list[int]:
    """Indices of the actors that do not answer a health call within `timeout` seconds (dead, stopped, frozen,
    or stuck in a call: an actor runs one call at a time)."""

    async def answers(h: Any) -> bool:
        try:
            await asyncio.wait_for(h.health.remote(), timeout)
            return True
        except (TimeoutError, *_LOST):
            return False

    ok = await asyncio.gather(*[answers(h) for h in handles])
    return [i for i, alive in enumerate(ok) if not alive]


async def restart_engines(cfg: RunConfig, dead: list[int], weights: WeightsRef | None) -> None:
    """Replace the engines `dead` and give the new ones `weights` (the trainer's current weights must be that
    version; None: the stage itself pushes weights, as sync does)."""
    fresh = [await actors.restart_engine(cfg, i) for i in dead]
    if weights is None or cfg.rollout_only:
        return  # rollout-only engines run the base checkpoint, which a fresh engine loads
    from tasks.transfer import trainer_weights, transfer_for

    held = await trainer_weights(cfg)
    if held.sha256 != weights.sha256:
        raise ActorLost(
            f"engines {dead} were replaced, but the trainer's weights (sha {held.sha256[:12]}) are not "
            f"version {weights.version} (sha {weights.sha256[:12]}) that the stage needs"
        )
    await transfer_for(cfg).push(cfg, fresh, weights.version, {})


async def restart_trainers(cfg: RunConfig) -> None:
    """Re-create every trainer rank and restore the latest step-boundary snapshot (else the run's start)."""
    from trainers.actor import snapshot_dir

    actors.kill_trainers(cfg)
    snap = latest_checkpoint(snapshot_dir(cfg.resolved_run_dir))
    resume = latest_checkpoint(cfg.checkpoint.load) if cfg.checkpoint.load else None
    fresh = await actors.start_trainers(cfg, actors.start_weights(cfg, resume))
    state = snap or resume
    if state is not None:
        await asyncio.gather(*[t.load.remote(str(state)) for t in fresh])


def unwrapped(e: ray.exceptions.RayTaskError) -> BaseException:
    """The exception an actor raised, as it raised it: its own type and message, which Prefect's state message
    then shows. Ray's wrapper text carries terminal colour codes. Ray's remote traceback, colour codes
    removed, is added as a note for the logs. `e` itself when Ray did not keep the cause."""
    cause = e.cause
    if not isinstance(cause, BaseException) or cause is e:
        return e
    cause.add_note(actors.ANSI.sub("", str(e)))
    return cause


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
