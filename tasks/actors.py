"""Creating, finding and re-creating the run's Ray actors.

Actors are named per run (`engine-<i>`, `trainer-<rank>`, `rollout`) in the namespace `rollflow-<run name>`,
so any task, in any process connected to the cluster, finds them with `ray.get_actor`. An actor that died
or hung is replaced by a new one under the same name (tasks/recovery.py decides when), in the same bundle of the
run's placement group (tasks/placement.py), so on the same node and slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from artifacts.checkpoints import model_dir
from config import RunConfig
from config.precision import concrete
from tasks import placement
from tasks.notify import notice
from trainers.collectives import LOOPBACK, rendezvous_host

# (namespace, actor name) -> handle created by this process. Non-detached named actors die when their
# creator drops the last handle, so this keeps them alive for the run; stages also reuse these handles
# instead of looking the name up in the cluster on every call.
_HANDLES: dict[tuple[str, str], Any] = {}
# run name -> (run id, when the run started): checkpoints name the run; fault hook lifetimes count from the start
_RUNS: dict[str, tuple[str, float]] = {}
# Whether what the actors print also reaches this process's console (Ray's log_to_driver printing, and Ray's own
# INFO lines); the quiet console of `rollflow run` turns it off. A run's logs/actors.log gets the lines either way.
_echo_actor_logs = True
_RAY_PRINTER = "ray_print_logs"  # the name Ray gives its log_to_driver handler
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# namespace -> the run's placement group, created with its first actor and kept until stop_actors: every actor of
# the run, and every replacement of one, is scheduled into its bundles
_PLACEMENTS: dict[str, placement.Placement] = {}
ROLLOUT = "rollout"  # the name of the run's rollout actor (rollout/actor.py)


# the last line of a Python traceback, `module.path.ClassName: message`
_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*([A-Z]\w*)(?::\s*(.*))?$")


class ActorStartError(RuntimeError):
    """An actor died in its constructor; the message names the actor and what its constructor raised."""


def start_failure(error: ray.exceptions.RayActorError, names: dict[str, str]) -> BaseException:
    """`error` as `ActorStartError` naming the actor (`names`: actor id hex -> name) and the exception its
    constructor raised (`Type: message`, the last line of the remote traceback Ray flattened into its text);
    `error` itself when the actor died after it started."""
    if not error.actor_init_failed:
        return error
    lines = [line.strip() for line in ANSI.sub("", str(error)).splitlines() if line.strip()]
    cause = lines[-1] if lines else type(error).__name__
    for line in reversed(lines):
        found = _EXCEPTION_LINE.match(line)
        if found:
            name, message = found.groups()
            cause = f"{name}: {message}" if message else name
            break
    who = names.get(error.actor_id or "", "an actor")
    return ActorStartError(f"{who} did not start: {cause}")


async def _answering(named: dict[str, Any], calls: list[Any]) -> list[Any]:
    """The results of `calls` on the actors `named` (name -> handle); an actor that died in its constructor is
    reported by `start_failure` instead of as Ray's ActorDiedError."""
    try:
        return list(await asyncio.gather(*calls))
    except ray.exceptions.RayActorError as e:
        raise start_failure(e, {a._actor_id.hex(): name for name, a in named.items()}) from None


def namespace(cfg: RunConfig) -> str:
    return f"rollflow-{cfg.name}"


def engines(cfg: RunConfig) -> list[Any]:
    """The run's engine actors, in index order (none in train-only mode)."""
    if cfg.train_only:
        return []
    return [_get(cfg, f"engine-{i}") for i in range(cfg.rollout.rollout_num_engines)]


def rollout_actor(cfg: RunConfig) -> Any:
    """The run's rollout actor (rollout/actor.py): it scores and writes what the engines generate."""
    return _get(cfg, ROLLOUT)


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
    """Join `--ray-address` or start a local Ray (no dashboard, on 127.0.0.1) once per process; a local one
    declares the run's process slots (tasks/placement.local_resources). Ray's environment (token authentication,
    gloo on loopback) must be set before `ray` was imported: flows.cli.configure_ray_env."""
    if ray.is_initialized():
        return
    if "RAY_AUTH_MODE" not in os.environ:
        raise RuntimeError(
            "Ray's environment is not set: call flows.cli.configure_ray_env() before ray is imported "
            "(Ray reads its authentication settings at import time)"
        )
    # Ray nices its workers to 15 by default; here the workers (engines, trainers) are the run's real
    # work and should not wait behind the orchestrating process and the Prefect server.
    os.environ.setdefault("RAY_worker_niceness", "0")
    level = logging.INFO if _echo_actor_logs else logging.WARNING  # "Started a local Ray instance." is INFO
    with _sigterm_handler_kept():  # Ray's would replace a flow run's (see there)
        if cfg.ray_address:
            from tasks.ray_address import check_ray_address

            # one line for an address where nothing answers or that refuses the token, before ray.init's long retries
            check_ray_address(cfg.ray_address)
            ray.init(address=cfg.ray_address, log_to_driver=True, logging_level=level)
        else:
            _local_ray_in_own_session()
            ray.init(
                num_cpus=max(2, os.cpu_count() or 2),
                resources=placement.local_resources(cfg),
                include_dashboard=False,
                log_to_driver=True,
                _node_ip_address="127.0.0.1",
                logging_level=level,
            )


@contextlib.contextmanager
def _sigterm_handler_kept() -> Iterator[None]:
    """While inside (`ray.init`), a SIGTERM handler that replaces one installed before is undone at exit. Ray's
    `init` installs its own (`sys.exit`) in the main thread. It would replace Prefect's SIGTERM bridge, which a
    flow run installs (the run's stop, flows/stop.py, behind it). A runner acknowledges a cancel only while that
    bridge is installed, and a rollout flow run reinstalls it only until it ends. So a cancel from Prefect that
    came between two rollouts would crash the run instead. In place of the default handler, Ray's stays."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(before) and signal.getsignal(signal.SIGTERM) is not before:
            signal.signal(signal.SIGTERM, before)


def _local_ray_in_own_session() -> None:
    """A local Ray's processes (GCS, raylet, workers) start in a session of their own. Ray starts them in the
    driver's process group, where a signal to the whole group (`timeout`, `kill -- -PGID`) would kill them under
    the run. The run then could not stop its actors. Ray already blocks Ctrl-C's SIGINT in them. They still end
    with the run (its stop, Ray's shutdown at exit, the reaper: flows/reaper.py). Relies on Ray starting them
    through `ray._private.services.ConsolePopen` (tests/unit/test_procs.py)."""
    from ray._private import services

    if getattr(services.ConsolePopen, "_own_session", False):
        return

    class OwnSession(services.ConsolePopen):
        _own_session = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "start_new_session": True})

    services.ConsolePopen = OwnSession  # type: ignore[misc]


def echo_actor_logs(on: bool) -> None:
    """Whether the actors' output (and Ray's INFO lines) reach this process's console from now on; set before
    `ensure_ray`. `actor_logs_to` writes the actors' output to a file in both cases."""
    global _echo_actor_logs
    _echo_actor_logs = on


@contextlib.contextmanager
def actor_logs_to(path: Path) -> Iterator[None]:
    """While inside: every line an actor prints, as Ray forwards it to this driver (log_to_driver), is appended to
    `path` as `(EngineActor pid=123) line`, colour codes removed; unless `echo_actor_logs(True)`, Ray stops
    printing them on the console meanwhile. With Ray's forwarding off (`ray.init(log_to_driver=False)` by
    someone else) no line arrives and nothing is written."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    path.parent.mkdir(parents=True, exist_ok=True)
    name = f"rollflow-actor-log-{path}"
    with open(path, "a", encoding="utf-8") as out:

        def write(data: dict[str, Any]) -> None:
            if (
                data.get("pid") == "autoscaler"
            ):  # the autoscaler's periodic status dumps (Ray's console drops them too)
                return
            who = data.get("actor_name") or data.get("task_name") or data.get("pid")
            pid = f" pid={data.get('pid')}" if who != data.get("pid") else ""  # e.g. "(raylet) ..."
            out.writelines(f"({who}{pid}) {ANSI.sub('', line)}\n" for line in data.get("lines", []))
            out.flush()

        # Ray's dispatcher is the one place every forwarded line passes (Ray's own client server taps it too)
        printer = (
            None if _echo_actor_logs else next((h for n, h in dispatcher.handlers if n == _RAY_PRINTER), None)
        )
        if printer is not None:
            dispatcher.remove_handler(_RAY_PRINTER)
        dispatcher.add_handler(name, write)
        try:
            yield
        finally:
            dispatcher.remove_handler(name)
            if printer is not None:
                dispatcher.add_handler(_RAY_PRINTER, printer)


def set_run(cfg: RunConfig, run_id: str, epoch: float) -> None:
    """Record the run's id and when it started, for the actors this process creates."""
    _RUNS[cfg.name] = (run_id, epoch)


def _epoch(cfg: RunConfig) -> float | None:
    return _RUNS[cfg.name][1] if cfg.name in _RUNS else None


def orchestrator_faults(cfg: RunConfig) -> Any:
    """A FaultInjector for the orchestrator's hooks of the run, or None when no request targets the orchestrator.
    Its claims are files in the run dir: every injector of the run fires a request once."""
    from faults import FaultInjector

    if not (cfg.faults.ci_fault_hooks or cfg.faults.ci_fault_hooks_path):  # the usual run: nothing to parse
        return None
    requests = [r for r in cfg.faults.requests() if r.targets("orchestrator", None)]
    if not requests:
        return None
    return FaultInjector(requests, "orchestrator", None, str(cfg.resolved_run_dir), _epoch(cfg))


def task_attempt() -> int | None:
    """The running Prefect task run's attempt (0 for the first, 1 for the first retry, ...); None outside one."""
    from prefect.runtime import task_run

    count = int(task_run.run_count or 0)
    return count - 1 if count > 0 else None


def stage_context(rollout_id: int, stage: str) -> dict[str, Any]:
    """What a stage's task passes its actors: the rollout, the task run's attempt (0, 1, ...) and the stage, which
    the fault hooks filter on and the actors' refusals name."""
    attempt = task_attempt() or 0
    if attempt:  # Prefect's log has the failure; the console says that the stage runs again
        what = "eval" if stage == "eval" else "rollout"
        notice(f"{what} {rollout_id}: retrying {stage} (attempt {attempt + 1})", logging.WARNING)
    return {"rollout_id": rollout_id, "attempt": attempt, "stage": stage}


def stage_end(cfg: RunConfig, stage: str, ctx: dict[str, Any]) -> None:
    """The stage-end fault hook (`config.stages.stage_end_hook`), reached by `stage`'s task after its actor work
    and files, before its records are logged and it returns; `ctx` holds the rollout and the task's attempt."""
    from config.stages import stage_end_hook

    faults = orchestrator_faults(cfg)
    if faults is not None:
        faults.reach(stage_end_hook(stage), rollout_id=ctx["rollout_id"], attempt=ctx["attempt"])


async def _placement(cfg: RunConfig) -> placement.Placement:
    """The run's placement group: created (and waited for) with the run's first actor, then reused."""
    if namespace(cfg) not in _PLACEMENTS:
        _PLACEMENTS[namespace(cfg)] = await placement.place(cfg)
    return _PLACEMENTS[namespace(cfg)]


def _engine(cfg: RunConfig, i: int, where: placement.Placement, checkpoint: str | None = None) -> Any:
    from engines.actor import EngineActor

    return EngineActor.options(  # type: ignore[attr-defined]
        name=f"engine-{i}", namespace=namespace(cfg), **where.engine_options(i)
    ).remote(
        cfg.rollout.rollout_backend,
        checkpoint or str(cfg.hf_checkpoint),
        cfg.num_threads,
        i,
        cfg.ci.ci_fault_drop_weight,
        cfg.faults.requests(),
        str(cfg.resolved_run_dir),
        _epoch(cfg),
        cfg.ci.ci_test and not cfg.ci.ci_disable_reexecution_checker,
        concrete(cfg.train.precision, cfg.train.train_backend),
    )


async def start_engines(cfg: RunConfig, checkpoint: str | None = None) -> list[Any]:
    """One engine actor per `--rollout-num-engines`, in its bundle, loading `checkpoint` (default
    --hf-checkpoint), and the rollout actor that scores and writes what they generate; waits until each answers
    `health`."""
    where = await _placement(cfg)
    actors = [_engine(cfg, i, where, checkpoint) for i in range(cfg.rollout.rollout_num_engines)]
    _keep(cfg, {f"engine-{i}": a for i, a in enumerate(actors)})
    finisher = _HANDLES.get((namespace(cfg), ROLLOUT)) or await _start_rollout_actor(cfg)
    named = {f"engine-{i}": a for i, a in enumerate(actors)}
    await _answering(named, [*[a.health.remote() for a in actors], finisher.prepare.remote(cfg)])
    return actors


async def _start_rollout_actor(cfg: RunConfig) -> Any:
    """A new rollout actor under its name, kept as the run's: on this process's node and in its working directory
    (the reward's imports and the run's relative paths resolve as here); Ray restarts it if it dies (it keeps
    nothing between calls but caches)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rollout.actor import RolloutActor
    from rollout.data import loaded_tokenizer_classes

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    actor = await _with_free_name(
        lambda: RolloutActor.options(  # type: ignore[attr-defined]
            name=ROLLOUT, namespace=namespace(cfg), scheduling_strategy=here, max_restarts=-1
        ).remote(
            os.getcwd(),
            cfg.faults.requests(),
            str(cfg.resolved_run_dir),
            _epoch(cfg),
            loaded_tokenizer_classes(cfg.hf_checkpoint),  # so the actor need not resolve it (torch)
        )
    )
    _keep(cfg, {ROLLOUT: actor})
    return actor


async def restart_rollout_actor(cfg: RunConfig) -> Any:
    """Kill the rollout actor (hung, stopped or alive) and start a new one; returns it once healthy."""
    _kill(cfg, ROLLOUT)
    actor = await _start_rollout_actor(cfg)
    await actor.prepare.remote(cfg)
    return actor


async def restart_engine(cfg: RunConfig, i: int) -> Any:
    """Kill engine `i` (dead, hung or alive) and start a new one under its name, in its bundle; returns it once
    healthy."""
    _kill(cfg, f"engine-{i}")
    where = await _placement(cfg)
    actor = await _with_free_name(lambda: _engine(cfg, i, where))
    _keep(cfg, {f"engine-{i}": actor})
    await _answering({f"engine-{i}": actor}, [actor.health.remote()])
    return actor


async def start_trainers(cfg: RunConfig, checkpoint: str) -> list[Any]:
    """One trainer actor per rank, in its bundle, built from `checkpoint`, joined in one process group whose
    rendezvous is rank 0's node (trainers/collectives.rendezvous_host)."""
    from trainers.actor import TrainerActor
    from trainers.settings import trainer_settings

    world = cfg.trainer_world_size
    settings = trainer_settings(cfg)  # the backend's flat section of the config, not the whole run config
    where = await _placement(cfg)

    def make(r: int) -> Any:
        return TrainerActor.options(  # type: ignore[attr-defined]
            name=f"trainer-{r}", namespace=namespace(cfg), **where.trainer_options(r)
        ).remote(
            cfg.train.train_backend,
            settings,
            checkpoint,
            r,
            world,
            cfg.faults.requests(),
            _epoch(cfg),
            _RUNS.get(cfg.name, ("", 0.0))[0],
        )

    actors = [await _with_free_name(lambda r=r: make(r)) for r in range(world)]
    _keep(cfg, {f"trainer-{r}": a for r, a in enumerate(actors)})
    named = {f"trainer-{r}": a for r, a in enumerate(actors)}
    nodes = await _answering(named, [a.node.remote() for a in actors])
    host = rendezvous_host(nodes)
    port = await actors[0].free_port.remote(host)  # free on rank 0's node, where the rendezvous listens
    placement.tell(
        cfg,
        f"trainers: {world} rank(s) on {len({n for n, _ in nodes})} node(s), rendezvous "
        + ("in a file store under the run dir" if host in LOOPBACK else f"at tcp://{host}:{port}"),
    )
    await asyncio.gather(*[a.setup.remote(host, port) for a in actors])
    return actors


async def start_run_actors(cfg: RunConfig, trainer_checkpoint: str) -> tuple[list[Any], list[Any]]:
    """The run's engines (with its rollout actor) and its trainers built from `trainer_checkpoint`, each side
    only where the mode has it: (engines, trainers). The two sides start at the same time: each is seconds of
    process start, imports and model loading, most of a short run's wall time. With --colocate the engines
    start first, so that they size their memory before the trainers take theirs on the same devices.
    If one side fails, the other is cancelled and the first error raised; the actors already created stay
    registered for `stop_actors`."""
    await _placement(cfg)  # one group for both sides, made before either asks for it

    async def engines() -> list[Any]:
        return [] if cfg.train_only else await start_engines(cfg)

    async def trainers() -> list[Any]:
        return [] if cfg.rollout_only else await start_trainers(cfg, trainer_checkpoint)

    if cfg.placement.colocate:
        return await engines(), await trainers()
    jobs = [asyncio.ensure_future(engines()), asyncio.ensure_future(trainers())]
    try:
        started = await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise
    return started[0], started[1]


def start_weights(cfg: RunConfig, resume: Path | None) -> str:
    """The trainer's starting weights, as slime picks them: the checkpoint it resumes from is loaded on top of
    --hf-checkpoint; without one, --load itself when it is an HF model dir, else --ref-load if given, else
    --hf-checkpoint."""
    load = cfg.checkpoint.load
    if resume is not None:
        return str(cfg.hf_checkpoint)
    if load and (Path(load) / "config.json").is_file():
        return load
    if cfg.ref_load:
        return str(model_dir(cfg.ref_load))
    return str(cfg.hf_checkpoint)


def kill_trainers(cfg: RunConfig) -> None:
    """Kill every trainer rank (one dead rank breaks the group: all are re-created together)."""
    for r in range(cfg.trainer_world_size):
        _kill(cfg, f"trainer-{r}")


def stop_actors(cfg: RunConfig) -> None:
    """Kill every actor of the run that is still alive, then give its placement group back."""
    for name in (
        [f"engine-{i}" for i in range(cfg.rollout.rollout_num_engines)]
        + [f"trainer-{r}" for r in range(cfg.trainer_world_size)]
        + [ROLLOUT]
    ):  # all names: modes may differ
        _kill(cfg, name)
    held = _PLACEMENTS.pop(namespace(cfg), None)
    if held is not None:
        placement.remove(held)


def _kill(cfg: RunConfig, name: str) -> None:
    key = (namespace(cfg), name)
    handle = _HANDLES.pop(key, None)
    if handle is None:
        with contextlib.suppress(ValueError):  # no such actor: already gone, or never created in this mode
            handle = ray.get_actor(name, namespace=namespace(cfg))
    if handle is not None:
        ray.kill(handle, no_restart=True)


async def _with_free_name(make: Any, attempts: int = 50) -> Any:
    """Create a named actor, waiting for the GCS to release the name of one just killed."""
    for _ in range(attempts - 1):
        try:
            return make()
        except ValueError as e:  # "The name ... is already taken": the kill is still being processed
            if "already" not in str(e):
                raise
            await asyncio.sleep(0.1)
    return make()


def _keep(cfg: RunConfig, named: dict[str, Any]) -> None:
    _HANDLES.update({(namespace(cfg), name): a for name, a in named.items()})
