"""Creating and finding the run's Ray actors.

Actors are named per run (`engine-<i>`, `trainer-<rank>`) in the namespace `rollflow-<run name>`,
so any task, in any process connected to the cluster, finds them with `ray.get_actor`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import ray

from flows.config import RunConfig

# Non-detached named actors die when their creator drops the last handle: keep them here for the run.
_ALIVE: dict[str, list[Any]] = {}


def namespace(cfg: RunConfig) -> str:
    return f"rollflow-{cfg.name}"


def engines(cfg: RunConfig) -> list[Any]:
    """The run's engine actors, in index order (none in train-only mode)."""
    if cfg.train_only:
        return []
    return [ray.get_actor(f"engine-{i}", namespace=namespace(cfg)) for i in range(cfg.rollout.rollout_num_engines)]


def trainers(cfg: RunConfig) -> list[Any]:
    """The run's trainer actors, in rank order (none in rollout-only mode)."""
    if cfg.rollout_only:
        return []
    return [ray.get_actor(f"trainer-{r}", namespace=namespace(cfg)) for r in range(cfg.train.data_parallel_size)]


def ensure_ray(cfg: RunConfig) -> None:
    """Join `--ray-address` or start a local Ray (no dashboard, no token files) once per process."""
    if ray.is_initialized():
        return
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, log_to_driver=True)
    else:
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=True)


async def start_engines(cfg: RunConfig, checkpoint: str) -> list[Any]:
    """One engine actor per `--rollout-num-engines`; waits until each answers `health`."""
    from engines.actor import EngineActor

    actors = [
        EngineActor.options(  # type: ignore[attr-defined]
            name=f"engine-{i}", namespace=namespace(cfg)).remote(
            cfg.rollout.rollout_backend, checkpoint, cfg.num_threads, i, cfg.ci.ci_fault_drop_weight)
        for i in range(cfg.rollout.rollout_num_engines)
    ]
    _ALIVE.setdefault(namespace(cfg), []).extend(actors)
    await asyncio.gather(*[a.health.remote() for a in actors])
    return actors


async def start_trainers(cfg: RunConfig, checkpoint: str) -> list[Any]:
    """One trainer actor per rank, joined in one process group."""
    from trainers.actor import TrainerActor

    world = cfg.train.data_parallel_size
    actors = [
        TrainerActor.options(  # type: ignore[attr-defined]
            name=f"trainer-{r}", namespace=namespace(cfg)).remote(cfg, checkpoint, r, world)
        for r in range(world)
    ]
    _ALIVE.setdefault(namespace(cfg), []).extend(actors)
    port = await actors[0].free_port.remote()
    await asyncio.gather(*[a.setup.remote("127.0.0.1", port) for a in actors])
    return actors


def stop_actors(cfg: RunConfig) -> None:
    """Kill every actor of the run that is still alive."""
    for name in [f"engine-{i}" for i in range(cfg.rollout.rollout_num_engines)] + \
                [f"trainer-{r}" for r in range(cfg.train.data_parallel_size)]:  # all names: modes may differ
        with contextlib.suppress(ValueError):  # no such actor: already gone, or never created in this mode
            ray.kill(ray.get_actor(name, namespace=namespace(cfg)))
    _ALIVE.pop(namespace(cfg), None)
