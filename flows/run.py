"""The RL loop as Prefect flows: one parent flow run per `rollflow run`, one child per rollout id."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from prefect import Task, flow
from prefect.runtime import flow_run
from prefect.utilities.annotations import NotSet, quote

from config import RunConfig
from faults import FaultInjector
from flows import run_page, runtime
from flows.children import ChildRuns
from flows.failure import explain, note_stage
from flows.report import RunReport, observers
from procs import freeze_heap, preload_arrow
from tasks import STAGE_NAMES, actors, notify, prefetch
from tasks.checks import metric_gate, raise_if_any, retry_unless_check_failed
from tasks.metrics import close_run, log_metrics
from tasks.recordings import inject, load_rollout
from tasks.refs import LogProbs, WeightsRef
from tasks.stages import (
    ask_engines_after_sync,
    check,
    evaluate,
    generate,
    injects,
    log_prob,
    save_checkpoint,
    save_rollout,
    start_first_rollout,
    start_log_prob,
    start_next_generation,
    sync,
    train_step,
)
from tasks.transfer import trainer_weights

STAGES = {
    "generate": generate,
    "save-rollout": save_rollout,
    "log-prob": log_prob,
    "train-step": train_step,
    "sync": sync,
    "check": check,
    "eval": evaluate,
    "load-rollout": load_rollout,
    "inject": inject,
}


ALL_STAGES = sorted(STAGES)
P = ParamSpec("P")
R = TypeVar("R")
assert tuple(ALL_STAGES) == STAGE_NAMES, "tasks.STAGE_NAMES must list every stage"


class _Stages:
    """The stage tasks of one rollout flow run, one typed attribute each, with the run's retry policy
    (`--task-retries`, `--task-retry-delay`; a checker failure is never retried) and `--refresh` ones forced,
    counting the task runs started; an exception a stage raises carries its rollout and stage
    (`flows.failure.note_stage`)."""

    def __init__(self, cfg: RunConfig, refresh: list[str], rollout_id: int) -> None:
        unknown = sorted(set(refresh) - set(STAGES))
        if unknown:
            raise ValueError(f"--refresh: unknown stage(s) {unknown}; stages are {ALL_STAGES}")
        self.cfg, self.refresh, self.rollout_id, self.started = cfg, refresh, rollout_id, 0
        self.generate = self._stage("generate", generate)
        self.load_rollout = self._stage("load-rollout", load_rollout)
        self.inject = self._stage("inject", inject)
        self.save_rollout = self._stage("save-rollout", save_rollout)
        self.log_prob = self._stage("log-prob", log_prob)
        self.train_step = self._stage("train-step", train_step)
        self.sync = self._stage("sync", sync)
        self.check = self._stage("check", check)
        self.eval = self._stage("eval", evaluate)

    def _stage(self, name: str, task: Task[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        configured = _configured(self.cfg, name, task, name in self.refresh)

        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            self.started += 1
            try:
                return await configured(*args, **kwargs)
            except Exception as e:
                note_stage(e, self.rollout_id, name)
                raise

        return run


# (stage task, retries, retry delay, refresh) -> the stage's task with those options
_CONFIGURED: dict[tuple[Task, str, str, bool], Task] = {}


def _configured(cfg: RunConfig, name: str, task: Task[P, R], refresh: bool) -> Task[P, R]:
    """`task` with the run's retry policy (none for check and inject) and `refresh`, made once per process and
    policy: every `Task.with_options` copy reads the task's source again (measured: about 50 ms of CPU per
    rollout flow run for its nine stages)."""
    f = cfg.faults
    key = (task, repr(f.task_retries), repr(f.task_retry_delay), refresh)
    if key not in _CONFIGURED:
        _CONFIGURED[key] = with_retries(
            cfg, task, retries=0 if name in ("check", "inject") else None
        ).with_options(refresh_cache=True if refresh else NotSet)
    return cast(Task[P, R], _CONFIGURED[key])


def with_retries(cfg: RunConfig, task: Task[P, R], retries: int | None = None) -> Task[P, R]:
    """`task` with the run's retry policy: --task-retries attempts (or `retries`) --task-retry-delay apart, a
    checker failure never retried."""
    f = cfg.faults
    return task.with_options(
        retries=f.task_retries if retries is None else retries,
        retry_delay_seconds=f.task_retry_delay,
        retry_condition_fn=retry_unless_check_failed,
    )


@dataclass(frozen=True)
class RolloutResult:
    """What a `rollout-<id>` flow run returns: the engines' weights after it, and how many task runs it
    started (at the end of the run, the parent waits for the server to have recorded those of the last rollout,
    `runtime.settle`)."""

    weights: WeightsRef
    task_runs: int


def opaque_config(cfg: RunConfig) -> RunConfig:
    """`cfg` marked so Prefect passes it to tasks without walking every field of it (looking for
    futures to wait on) on each call; the task still receives the RunConfig itself, and cache keys
    still see it. Measured: about a tenth of the orchestrating process's CPU time per rollout."""
    return cast(RunConfig, quote(cfg))


def _run_name() -> str:
    return f"run/{flow_run.parameters['cfg'].name}"


# Prefect's validation of the parameters (pydantic over the whole RunConfig, ~10 ms a flow run on a busy machine,
# before the run starts) is skipped: the parent passes a validated RunConfig; the body validates what comes as
# plain data (a run started through the API), as Prefect would have.
@flow(name="rollout", flow_run_name="rollout-{rollout_id}", log_prints=True, validate_parameters=False)
async def rollout_flow(
    cfg: RunConfig, rollout_id: int, weights: WeightsRef, session: str, refresh: list[str] | None = None
) -> RolloutResult:
    """One RL iteration: generate -> save-rollout -> log-prob -> train-step -> sync -> check (+ eval).

    --debug-rollout-only stops after save-rollout; --load-debug-rollout-data (train-only) loads a
    recording instead of generating and never syncs; --ci-inject-rollout-data-path generates, then
    checks the generation against the recording and trains on the recording."""
    if not isinstance(cfg, RunConfig) or not isinstance(weights, WeightsRef):
        cfg, weights = RunConfig.model_validate(cfg), WeightsRef.model_validate(weights)
        rollout_id = int(rollout_id)
    prefetch.done(cfg, "begin", rollout_id, weights)  # the parent's head start on the run's first rollout
    s, d, q = (
        _Stages(cfg, refresh or [], rollout_id),
        cfg.debug,
        opaque_config(cfg),
    )  # q: cfg as the tasks' argument
    has_engines = not cfg.train_only
    if _evaluates_before(cfg, rollout_id):
        await s.eval(q, 0, weights)
    recording = d.load_debug_rollout_data or d.load_forge_rollout_data
    if recording:
        rollout = await s.load_rollout(q, rollout_id, recording, forge=bool(d.load_forge_rollout_data))
    else:
        injecting = injects(cfg, rollout_id)
        if not injecting:  # the trainers' log-prob pass starts once generate has written the rollout
            prefetch.when(
                cfg, "generate", rollout_id, lambda ref: start_log_prob(cfg, rollout_id, ref, weights)
            )
        rollout = await s.generate(q, rollout_id, weights, fresh=injecting)
        if injecting:
            rollout = await s.inject(q, rollout_id, rollout)
        else:  # a cached generate task wrote nothing: what waited for its rollout runs now
            prefetch.done(cfg, "generate", rollout_id, rollout)
    await s.save_rollout(q, rollout_id, rollout, loaded=bool(d.load_debug_rollout_data))
    runtime.rollout_saved(session)  # the parent's posts and next flow run, off the generation
    steps: list[dict] = []
    logprobs: LogProbs | None = None
    if not cfg.rollout_only:
        logprobs = await s.log_prob(q, rollout_id, rollout, weights)
        steps = await s.train_step(q, rollout_id, rollout, logprobs.table, session)
        if has_engines:
            weights = await s.sync(q, rollout_id, rollout=rollout, logprobs=logprobs.table)
    synced = has_engines and not cfg.rollout_only
    await s.check(q, rollout_id, steps, weights if synced else None, logprobs.stats if logprobs else None)
    if _evaluates_after(cfg, rollout_id):
        await s.eval(q, rollout_id + 1, weights)
    result = RolloutResult(weights, s.started)  # the parent's publisher then attaches the metrics table
    runtime.rollout_returning(session, result)  # the parent goes on while Prefect records this run's end
    return result


@flow(name="rollflow-run", flow_run_name=_run_name, log_prints=True)
async def run_flow(
    cfg: RunConfig, refresh: list[str] | None = None, resume: bool = False, overwrite: bool = False
) -> dict:
    """The whole run: own the run dir, start Ray actors, then one `rollout-<id>` child flow run per rollout id.
    `resume` continues the run in `cfg`'s run dir where it was cut; `overwrite` replaces another run's records.

    As it goes, the run's report (`flows.report`) feeds the observers (the console of `rollflow run`) and the run's
    page in the Prefect UI (`flows.run_page`); at the end, with --ci-test, `rollflow doctor` runs on the run dir
    and its findings join both. Log lines go to `<run dir>/logs/run.log`, the actors' output to logs/actors.log."""
    runtime.retry_busy_server_quickly()
    # a Prefect retry of this flow run (UI, `prefect flow-run retry`) continues the run like --resume
    owned = runtime.own(cfg, resume=resume or (flow_run.run_count or 1) > 1, overwrite=overwrite)
    cfg = owned.cfg
    await runtime.crash_stale_flow_run(owned.previous_flow_run)
    runtime.record_flow_run(owned, str(flow_run.get_id()))
    faults = FaultInjector(
        cfg.faults.requests(), "orchestrator", None, str(cfg.resolved_run_dir), owned.info.started_at
    )
    if not owned.resumed:
        faults.log_pending()
    report = RunReport.load(cfg, owned.info.run_id, owned.start, _end(cfg, owned.start))
    page = run_page.RunPage(report, uuid.UUID(str(flow_run.get_id()))) if run_page.enabled() else None
    loop = _RunLoop(cfg, owned, report, page, faults, refresh or [])
    with runtime.run_log(cfg.resolved_run_dir), _listening(report), runtime.api_watchdog(cfg):
        await _started(report, page)
        try:
            actors.ensure_ray(cfg)
            with actors.actor_logs_to(cfg.resolved_run_dir / "logs" / "actors.log"):
                weights = await loop.run()
            _dispose_gate(cfg, report)
            report.finish("completed" if report.done >= report.total else "stopped")
        except BaseException as e:
            report.finish("failed", explain(e))
            raise
        finally:
            faults.expire_unfired()
            close_run(cfg)  # trackers finished and plots/curves.png drawn, also when the run failed
            owned.release()
            await _wrap_up(report, page)
    return {
        "run_dir": str(cfg.resolved_run_dir),
        "weight_version": weights.version,
        "evals": {
            r["rollout_id"]: {k: v for k, v in r["metrics"].items() if k != "eval/step"}
            for r in report.records
            if r["kind"] == "eval"
        },
    }


class _RunLoop:
    """The run's actors and its rollouts: start the actors (restoring the trainers on a resume), sync the first
    weights, run one `rollout-<id>` child flow run per rollout, and stop the actors however it ends."""

    def __init__(
        self,
        cfg: RunConfig,
        owned: runtime.OwnedRun,
        report: RunReport,
        page: run_page.RunPage | None,
        faults: FaultInjector,
        refresh: list[str],
    ) -> None:
        self.cfg, self.owned, self.report, self.page, self.faults = cfg, owned, report, page, faults
        self.refresh = refresh

    async def run(self) -> WeightsRef:
        """Every rollout from the run's start point to its end; the engines' weights after the last one."""
        cfg, owned = self.cfg, self.owned
        actors.set_run(cfg, owned.info.run_id, owned.info.started_at)
        actors.stop_actors(cfg)  # leftovers of a crashed run with the same name
        session = uuid.uuid4().hex
        self.publisher = runtime.Publisher(cfg, self.report.records, self.page, session)
        self.children = ChildRuns(rollout_flow, session)
        ok = False
        try:
            weights = await self._start_actors()
            runtime.yield_to_actors(cfg)
            preload_arrow()
            freeze_heap()  # Prefect, Ray, torch and the config are set up for the run
            last: tuple[uuid.UUID | None, int] | None = None
            for rollout_id in range(owned.start, self.report.end):
                weights, last = await self._rollout(rollout_id, weights, session)
                if rollout_id == owned.start:  # what the first rollout imported and cached stays for the run
                    freeze_heap()
            if self.report.end < cfg.rollout.num_rollout:
                notify.notice(f"--debug-exit-after-rollout: stopping after rollout {self.report.end - 1}")
            await self.children.finish()
            await self.publisher.drain()
            if (
                last is not None
            ):  # task runs are recorded in order: the last rollout's last ones are the run's
                await runtime.settle(last[1], flow_run_id=last[0])
            ok = True
            return weights
        finally:
            prefetch.drop()
            await self.children.close()
            if not ok:
                await self.publisher.drain(raise_errors=False)
            actors.stop_actors(cfg)

    async def _start_actors(self) -> WeightsRef:
        """Engines and trainers started (trainers restored on a resume); the weights the engines hold."""
        cfg, owned = self.cfg, self.owned
        engines, trainers = await actors.start_run_actors(cfg, actors.start_weights(cfg, owned.trainer_state))
        start = owned.start
        if owned.trainer_state is not None and trainers:
            await asyncio.gather(*[t.load.remote(str(owned.trainer_state)) for t in trainers])
            notify.notice(f"trainers restored from {owned.trainer_state}; starting at rollout {start}")
        elif cfg.checkpoint.load and trainers:
            notify.notice(
                f"--load {cfg.checkpoint.load} holds no checkpoint yet: starting from "
                f"{actors.start_weights(cfg, None)}"
            )
        if engines and trainers:  # the weight-update checker runs at the run's first sync, not at a resume
            check_first_sync = cfg.ci.weight_check and not owned.resumed
            return await with_retries(cfg, sync)(opaque_config(cfg), start - 1, verify_equal=check_first_sync)
        if engines:  # rollout-only: the engines keep the weights they loaded, version 0
            return WeightsRef(version=0, sha256=await engines[0].weights_sha256.remote())
        # train-only: nothing to sync; identify the trainer's starting weights
        return WeightsRef(version=start, sha256=(await trainer_weights(cfg)).sha256)

    async def _rollout(
        self, rollout_id: int, weights: WeightsRef, session: str
    ) -> tuple[WeightsRef, tuple[uuid.UUID | None, int]]:
        """One child flow run, then the parent's share: a checkpoint when due, the rollout's wall time, the
        observers; its Prefect artifacts (metrics table, run page) go to the publisher, posted in the background.
        Returns the weights after it, and its flow run id with the number of task runs it started."""
        cfg, report = self.cfg, self.report
        began = time.perf_counter()
        # the rollout a resume re-runs logs everything again: none of its stages may come from the cache
        stages = ALL_STAGES if self.owned.resumed and rollout_id == self.owned.start else self.refresh
        params = dict(cfg=cfg, rollout_id=rollout_id, weights=weights, session=session, refresh=stages)
        last = rollout_id + 1 == report.end
        # the next rollout's flow run is made while this one runs (all its parameters but the weights)
        ahead = (
            None if last else dict(cfg=cfg, rollout_id=rollout_id + 1, session=session, refresh=self.refresh)
        )
        # the next generation overlaps this run's check, eval and end
        ask_engines_after_sync(
            cfg, rollout_id, generation=not last, evaluation=_evaluates_after(cfg, rollout_id)
        )
        if rollout_id == self.owned.start:  # the first rollout's, as its flow run begins
            evaluation = _evaluates_before(cfg, rollout_id)
            prefetch.when(
                cfg, "begin", rollout_id, lambda w: start_first_rollout(cfg, rollout_id, w, evaluation)
            )
        result, child = await self.children.run(params, ahead)
        assert isinstance(result, RolloutResult)
        saves = not cfg.rollout_only and (_save_due(cfg, rollout_id) or (cfg.checkpoint.save and last))
        if not last:  # the engines generate the next rollout while Prefect records this one
            # its log-prob pass follows on the trainers, unless they save a checkpoint first
            start_next_generation(cfg, rollout_id + 1, result.weights, log_probs=not saves)
        if saves:
            await with_retries(cfg, save_checkpoint)(opaque_config(cfg), rollout_id)
        seconds = time.perf_counter() - began
        runtime.log_step_time(cfg, rollout_id, seconds)
        report.rollout_done(rollout_id, seconds)
        self.publisher.rollout_done(rollout_id, child)
        for observer in observers():
            observer.rollout_done(report, rollout_id)
        self.faults.reach(
            "orchestrator_rollout_end",
            rollout_id=rollout_id,
            attempt=0,
            weight_version=result.weights.version,
        )
        return result.weights, (child, result.task_runs)


def _end(cfg: RunConfig, start: int) -> int:
    """The rollout the run stops before: --num-rollout, or earlier with --debug-exit-after-rollout (the knife that
    stops a run cleanly, e.g. to test resume)."""
    end = cfg.rollout.num_rollout
    if cfg.debug.debug_exit_after_rollout is not None:
        end = min(end, start + cfg.debug.debug_exit_after_rollout)
    return end


@contextlib.contextmanager
def _listening(report: RunReport) -> Iterator[None]:
    """`report` receives the run's records as they are logged."""
    unsubscribe = notify.subscribe(report)
    try:
        yield
    finally:
        unsubscribe()


async def _started(report: RunReport, page: run_page.RunPage | None) -> None:
    """The run page's artifacts created; the observers told."""
    if page is not None:
        await page.open()
    for observer in observers():
        observer.started(report)


def _dispose_gate(cfg: RunConfig, report: RunReport) -> None:
    """The accuracy gate, disposed at the end of the run as in miles: logged as a check record, raised on failure."""
    gate = metric_gate(cfg, [r for r in report.records if r["kind"] == "eval"])
    if cfg.ci.ci_metric_checker_key:
        log_metrics(
            cfg, "check", cfg.rollout.num_rollout, {"check/metric_gate": 0.0 if gate else 1.0}, sync=True
        )
    raise_if_any(gate)


async def _wrap_up(report: RunReport, page: run_page.RunPage | None) -> None:
    """However the run ended: the doctor's findings (--ci-test), the run page's last update, the observers told.
    A failure here is reported, never raised: it must not hide how the run itself ended."""
    if report.cfg.ci.ci_test:
        _diagnose(report)
    if page is not None:
        try:
            await page.close()
        except Exception as e:
            notify.notice(
                f"could not update the run's Prefect artifacts: {type(e).__name__}: {e}", logging.WARNING
            )
    for observer in observers():
        observer.finished(report)


def _diagnose(report: RunReport) -> None:
    """`rollflow doctor` on the run dir, its findings into the report."""
    from flows.doctor import DoctorInputError, diagnose

    try:
        report.findings = diagnose(report.cfg.resolved_run_dir)
    except DoctorInputError as e:
        report.doctor_error = str(e)
    except Exception as e:  # the doctor is a diagnosis of the run, not part of its outcome
        report.doctor_error = f"{type(e).__name__}: {e}"


def _evaluates(cfg: RunConfig) -> bool:
    """Eval needs engines, an --eval-interval and eval data."""
    return bool(cfg.eval.eval_interval and cfg.data.eval_prompt_data and not cfg.train_only)


def _evaluates_before(cfg: RunConfig, rollout_id: int) -> bool:
    """Whether rollout `rollout_id`'s flow run evaluates its starting weights first: eval 0, before rollout 0."""
    return rollout_id == 0 and _evaluates(cfg)


def _evaluates_after(cfg: RunConfig, rollout_id: int) -> bool:
    """Whether rollout `rollout_id`'s flow run ends with eval `rollout_id + 1` of the weights it synced: every
    --eval-interval rollouts, and after the last."""
    every = cfg.eval.eval_interval
    if not every or not _evaluates(cfg):
        return False
    return (rollout_id + 1) % every == 0 or rollout_id + 1 == cfg.rollout.num_rollout


def _save_due(cfg: RunConfig, rollout_id: int) -> bool:
    c = cfg.checkpoint
    if not c.save:
        return False
    last = rollout_id + 1 == cfg.rollout.num_rollout
    return last or (c.save_interval is not None and (rollout_id + 1) % c.save_interval == 0)
