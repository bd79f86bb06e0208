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

# (namespace, actor name) -> handle created by this process. Non-detached named actors die when their
# creator drops the last handle, so this keeps them alive for the run; stages also reuse these handles
# instead of looking the name up in the cluster on every call.
_HANDLES: dict[tuple[str, str], Any] = {}


def namespace(cfg: RunConfig) -> str:
    return f"rollflow-{cfg.name}"


def engines(cfg: RunConfig) -> list[Any]:
    """The run's engine actors, in index order (none in train-only mode)."""
    if cfg.train_only:
        return []
    return [_get(cfg, f"engine-{i}") for i in range(cfg.rollout.rollout_num_engines)]


def trainers(cfg: RunConfig) -> list[Any]:
    """The run's trainer actors, in rank order (none in rollout-only mode)."""
    if cfg.rollout_only:
        return []
    return [_get(cfg, f"trainer-{r}") for r in range(cfg.trainer_world_size)]


def _get(cfg: RunConfig, name: str) -> Any:
    """The named actor: the handle this process created, else a lookup in the cluster (a GCS round trip)."""
    handle = _HANDLES.get((namespace(cfg), name))
    return handle if handle is not None else ray.get_actor(name, namespace=namespace(cfg))


def ensure_ray(cfg: RunConfig) -> None:
    """Join `--ray-address` or start a local Ray (no dashboard, no token files) once per process."""
    if ray.is_initialized():
        return
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray nices its workers to 15 by default; here the workers (engines, trainers) are the run's real
    # work and should not wait behind the orchestrating process and the Prefect server.
    os.environ.setdefault("RAY_worker_niceness", "0")
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
    _keep(cfg, {f"engine-{i}": a for i, a in enumerate(actors)})
    await asyncio.gather(*[a.health.remote() for a in actors])
    return actors


async def start_trainers(cfg: RunConfig, checkpoint: str) -> list[Any]:
    """One trainer actor per rank (tensor x data parallel), joined in one process group."""
    from trainers.actor import TrainerActor

    world = cfg.trainer_world_size
    actors = [
        TrainerActor.options(  # type: ignore[attr-defined]
            name=f"trainer-{r}", namespace=namespace(cfg)).remote(cfg, checkpoint, r, world)
        for r in range(world)
    ]
    _keep(cfg, {f"trainer-{r}": a for r, a in enumerate(actors)})
    port = await actors[0].free_port.remote()
    await asyncio.gather(*[a.setup.remote("127.0.0.1", port) for a in actors])
    return actors


def stop_actors(cfg: RunConfig) -> None:
    """Kill every actor of the run that is still alive."""
    for name in [f"engine-{i}" for i in range(cfg.rollout.rollout_num_engines)] + \
                [f"trainer-{r}" for r in range(cfg.trainer_world_size)]:  # all names: modes may differ
        with contextlib.suppress(ValueError):  # no such actor: already gone, or never created in this mode
            ray.kill(ray.get_actor(name, namespace=namespace(cfg)))
    for key in [k for k in _HANDLES if k[0] == namespace(cfg)]:
        del _HANDLES[key]


def _keep(cfg: RunConfig, named: dict[str, Any]) -> None:
    _HANDLES.update({(namespace(cfg), name): a for name, a in named.items()})
