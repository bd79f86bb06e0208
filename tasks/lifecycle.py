"""The run's own tasks around its rollouts, so that the parent flow run's timeline holds them too: starting the
actors (restoring the trainers on a resume) and stopping them. The first weight sync is the `sync` stage task."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from config import RunConfig
from tasks import actors


@task(name="start-actors", cache_policy=NO_CACHE, log_prints=True)
async def start_actors(cfg: RunConfig, trainer_state: str | None = None) -> tuple[int, int]:
    """Start the run's engines (with its rollout actor) and trainers, each only where the mode has them. Any
    actors a crashed run of the same name left are killed first. The trainers then load `trainer_state` (a
    resume's snapshot or checkpoint) when given. Returns (engines, trainers) started."""
    actors.stop_actors(cfg)  # leftovers of a crashed run with the same name
    state = Path(trainer_state) if trainer_state else None
    engines, trainers = await actors.start_run_actors(cfg, actors.start_weights(cfg, state))
    if state is not None and trainers:  # all ranks at once: a backend's load may be collective
        await asyncio.gather(*[t.load.remote(str(state)) for t in trainers])
    return len(engines), len(trainers)


@task(name="stop-actors", cache_policy=NO_CACHE)
def stop_actors(cfg: RunConfig) -> None:
    """Kill the run's actors and give their placement group back."""
    actors.stop_actors(cfg)
