"""The RL loop as Prefect flows: one parent flow run per `rollflow run`, one child per rollout id."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prefect import flow
from prefect.artifacts import TableArtifact
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from artifacts.atomic import atomic_write_text
from artifacts.checkpoints import latest_checkpoint, model_dir
from artifacts.store import RunPaths, read_metrics
from flows.config import RunConfig, dump_yaml
from flows.resolve import resolve
from tasks import actors
from tasks.checks import metric_gate, raise_if_any
from tasks.metrics import log_metrics
from tasks.recordings import inject, load_rollout
from tasks.refs import WeightsRef
from tasks.stages import (
    artifact_slug,
    check,
    evaluate,
    generate,
    log_prob,
    save_checkpoint,
    save_rollout,
    sync,
    train_step,
)

STAGES = {"generate": generate, "save-rollout": save_rollout, "log-prob": log_prob, "train-step": train_step,
          "sync": sync, "check": check, "eval": evaluate, "load-rollout": load_rollout, "inject": inject}


class _Stages:
    """The stage tasks of one rollout flow run (`--refresh` ones forced), counting the task runs started."""

    def __init__(self, refresh: list[str]) -> None:
        unknown = sorted(set(refresh) - set(STAGES))
        if unknown:
            raise ValueError(f"--refresh: unknown stage(s) {unknown}; stages are {sorted(STAGES)}")
        self._tasks: dict[str, Any] = {
            name: t.with_options(refresh_cache=True) if name in refresh else t  # type: ignore[attr-defined]
            for name, t in STAGES.items()}
        self.started = 0

    def __getitem__(self, name: str) -> Any:
        task = self._tasks[name]

        async def run(*args: Any, **kwargs: Any) -> Any:
            self.started += 1
            return await task(*args, **kwargs)
        return run


@dataclass(frozen=True)
class RolloutResult:
    """What a `rollout-<id>` flow run returns: the engines' weights after it, and how many task runs it
    started (the parent waits for the server to have recorded that many, `_settle`)."""

    weights: WeightsRef
    task_runs: int


def opaque_config(cfg: RunConfig) -> RunConfig:
    """`cfg` marked so Prefect passes it to tasks without walking every field of it (looking for
    futures to wait on) on each call; the task still receives the RunConfig itself, and cache keys
    still see it. Measured: about a tenth of the orchestrating process's CPU time per rollout."""
    return cast(RunConfig, quote(cfg))


def _run_name() -> str:
    return f"run/{flow_run.parameters['cfg'].name}"


@flow(name="rollout", flow_run_name="rollout-{rollout_id}", log_prints=True)
async def rollout_flow(cfg: RunConfig, rollout_id: int, weights: WeightsRef, session: str,
                       refresh: list[str] | None = None) -> RolloutResult:
    """One RL iteration: generate -> save-rollout -> log-prob -> train-step -> sync -> check (+ eval).

    --debug-rollout-only stops after save-rollout; --load-debug-rollout-data (train-only) loads a
    recording instead of generating and never syncs; --ci-inject-rollout-data-path generates, then
    checks the generation against the recording and trains on the recording."""
    s, d, q = _Stages(refresh or []), cfg.debug, opaque_config(cfg)  # q: cfg as the tasks' argument
    has_engines = not cfg.train_only
    if rollout_id == 0 and _evaluates(cfg):
        await s["eval"](q, 0, weights)
    recording = d.load_debug_rollout_data or d.load_forge_rollout_data
    if recording:
        rollout = await s["load-rollout"](q, rollout_id, recording, forge=bool(d.load_forge_rollout_data))
    else:
        injecting = bool(d.ci_inject_rollout_data_path) and rollout_id >= d.ci_inject_rollout_data_start_rollout_id
        rollout = await s["generate"](q, rollout_id, weights, fresh=injecting)
        if injecting:
            rollout = await s["inject"](q, rollout_id, rollout)
    await s["save-rollout"](q, rollout_id, rollout, loaded=bool(d.load_debug_rollout_data))
    steps: list[dict] = []
    if not cfg.rollout_only:
        logprobs = await s["log-prob"](q, rollout_id, rollout, weights)
        steps = await s["train-step"](q, rollout_id, rollout, logprobs, session)
        if has_engines:
            weights = await s["sync"](q, rollout_id)
    synced = has_engines and not cfg.rollout_only
    await s["check"](q, rollout_id, steps, weights if synced else None)
    if _eval_due(cfg, rollout_id) and _evaluates(cfg):
        await s["eval"](q, rollout_id + 1, weights)
    return RolloutResult(weights, s.started)  # the parent then attaches the metrics table (_publish_metrics_table)


@flow(name="rollflow-run", flow_run_name=_run_name, log_prints=True)
async def run_flow(cfg: RunConfig, refresh: list[str] | None = None) -> dict:
    """The whole run: start Ray actors, then one `rollout-<id>` child flow run per rollout id."""
    cfg = prepare(cfg)
    actors.ensure_ray(cfg)
    actors.stop_actors(cfg)  # leftovers of a crashed run with the same name
    try:
        resume = latest_checkpoint(cfg.checkpoint.load) if cfg.checkpoint.load else None
        engines = [] if cfg.train_only else await actors.start_engines(cfg, str(cfg.hf_checkpoint))
        trainers = [] if cfg.rollout_only else await actors.start_trainers(cfg, _start_weights(cfg, resume))
        start = 0
        if resume is not None and trainers:
            # all ranks at once: a backend's load may be collective (megatron's distributed checkpoint)
            start = 1 + max(await asyncio.gather(*[t.load.remote(str(resume)) for t in trainers]))
            print(f"resumed from {resume} at rollout {start}")
        elif cfg.checkpoint.load:
            print(f"--load {cfg.checkpoint.load} holds no checkpoint yet: starting from {_start_weights(cfg, None)}")
        if engines and trainers:
            check_first_sync = cfg.ci.weight_check and not (cfg.train_only or cfg.rollout_only)
            weights = await _settled(sync, opaque_config(cfg), start - 1, verify_equal=check_first_sync)
        elif engines:  # rollout-only: the engines keep the weights they loaded, version 0
            weights = WeightsRef(version=0, sha256=await engines[0].weights_sha256.remote())
        else:  # train-only: nothing to sync; identify the trainer's starting weights
            weights = WeightsRef(version=start, sha256=await trainers[0].weights_sha256.remote())
        session = uuid.uuid4().hex
        end = cfg.rollout.num_rollout
        if cfg.debug.debug_exit_after_rollout is not None:  # the knife: stop cleanly, e.g. to test resume
            end = min(end, start + cfg.debug.debug_exit_after_rollout)
        for rollout_id in range(start, end):
            began = time.perf_counter()
            state = await rollout_flow(cfg, rollout_id, weights, session, refresh, return_state=True)
            result: RolloutResult = await state.result()  # type: ignore[misc]
            log_metrics(cfg, "perf", rollout_id, {"perf/step_time": time.perf_counter() - began})
            weights = result.weights
            await _settle(result.task_runs, flow_run_id=state.state_details.flow_run_id)
            await _publish_metrics_table(cfg, rollout_id, state.state_details.flow_run_id)
            if trainers and (_save_due(cfg, rollout_id) or (cfg.checkpoint.save and rollout_id + 1 == end)):
                await _settled(save_checkpoint, opaque_config(cfg), rollout_id)
        if end < cfg.rollout.num_rollout:
            print(f"--debug-exit-after-rollout: stopping after rollout {end - 1}")
    finally:
        actors.stop_actors(cfg)
    evals = [r for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == "eval"]
    gate = metric_gate(cfg, evals)  # the accuracy gate is disposed at the end of the run, as in miles
    if cfg.ci.ci_metric_checker_key:
        log_metrics(cfg, "check", cfg.rollout.num_rollout, {"check/metric_gate": 0.0 if gate else 1.0})
    raise_if_any(gate)
    return {"run_dir": str(cfg.resolved_run_dir), "weight_version": weights.version,
            "evals": {r["rollout_id"]: {k: v for k, v in r["metrics"].items() if k != "eval/step"} for r in evals}}


async def _settle(task_runs: int, *, flow_run_id: uuid.UUID | None = None, task_run_id: uuid.UUID | None = None,
                  timeout: float = 5.0) -> bool:
    """Wait until the server has recorded `task_runs` task runs of the given flow run (or the one task
    run `task_run_id`), each in a final state; False if that took longer than `timeout` seconds.

    Task runs reach the server as events that a background service writes to SQLite one by one; when
    the parent creates the next child flow run while it writes, SQLite refuses the request ("database
    is locked"), the API answers 503 and Prefect's client backs off for 2 s. Waiting here (a read every
    20 ms) keeps the two writers apart. The count matters: the last task's events can still be on their
    way when the earlier task runs are recorded final (measured: a 2 s stall every 5-10 rollouts when
    only the task runs already recorded were awaited).
    """
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterId

    query = ({"task_run_filter": TaskRunFilter(id=TaskRunFilterId(any_=[task_run_id]))} if task_run_id is not None
             else {"flow_run_filter": FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))})
    with anyio.move_on_after(timeout):
        async with get_client() as client:
            while True:
                runs = await client.read_task_runs(**query)
                if len(runs) >= task_runs and all(r.state is not None and r.state.is_final() for r in runs):
                    return True
                await anyio.sleep(0.02)
    return False


async def _settled(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one of the parent flow's own tasks, wait until the server has recorded its task run
    (`_settle`), and return its result (raising as the task did)."""
    state = await task(*args, return_state=True, **kwargs)
    await _settle(1, task_run_id=state.state_details.task_run_id)
    return await state.result()


def prepare(cfg: RunConfig) -> RunConfig:
    """Resolve the config (flows.resolve: recipe presets, data, reward, template check), then write the
    resolved config.yaml into the run dir; nothing is written before the config resolved."""
    cfg, _ = resolve(cfg)
    cfg = cfg.model_copy(update={"run_dir": str(cfg.resolved_run_dir)})
    RunPaths(cfg.resolved_run_dir).rollout(0).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(cfg.resolved_run_dir) / "config.yaml", dump_yaml(cfg))
    return cfg


def _start_weights(cfg: RunConfig, resume: Path | None) -> str:
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


def _evaluates(cfg: RunConfig) -> bool:
    """Eval needs engines, an --eval-interval and eval data."""
    return bool(cfg.eval.eval_interval and cfg.data.eval_prompt_data and not cfg.train_only)


def _eval_due(cfg: RunConfig, rollout_id: int) -> bool:
    every = cfg.eval.eval_interval
    if not every:
        return False
    return ((rollout_id + 1) % every == 0 or rollout_id + 1 == cfg.rollout.num_rollout)


def _save_due(cfg: RunConfig, rollout_id: int) -> bool:
    c = cfg.checkpoint
    if not c.save:
        return False
    last = rollout_id + 1 == cfg.rollout.num_rollout
    return last or (c.save_interval is not None and (rollout_id + 1) % c.save_interval == 0)


async def _publish_metrics_table(cfg: RunConfig, rollout_id: int, flow_run_id) -> None:
    """One Prefect table artifact per rollout with every metric logged for it, attached to the rollout's
    `rollout-<id>` flow run. The parent posts it once the child's task runs are recorded (`_settle`):
    posted at the end of the child, it waited behind the server's burst of task-run writes (about 80 ms
    of every child flow run on 2 cores), and posted concurrently with them SQLite answers 503."""
    rows = [{"kind": r["kind"], "step": r.get("step", ""), "metric": k, "value": v}
            for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics)
            if r["rollout_id"] == rollout_id and r["kind"] != "eval" for k, v in r["metrics"].items()]
    key = f"{artifact_slug(cfg.name)}-rollout-{rollout_id}-metrics"
    await TableArtifact(key=key, description=f"metrics of rollout {rollout_id} of run {cfg.name}", table=rows,
                        flow_run_id=flow_run_id).acreate()
