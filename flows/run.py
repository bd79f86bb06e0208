"""The RL loop as Prefect flows: one parent flow run per `rollflow run`, one child per rollout id."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.states import Failed, State

from artifacts.rundir import Outcome, clear_outcome, write_outcome
from config import RunConfig
from config.stages import STAGES
from faults import FaultInjector
from flows import run_page, runtime, stop
from flows.failure import describe, explain, stage_of
from flows.prefect_private import retry_busy_server_quickly
from flows.report import RunReport, observers
from flows.stages import Stages, opaque_config, with_policy
from procs import freeze_heap, preload_arrow
from tasks import actors, notify
from tasks.checks import metric_gate, raise_if_any
from tasks.lifecycle import start_actors, stop_actors
from tasks.memory import run_memory
from tasks.metrics import close_run, log_metrics
from tasks.refs import LogProbs, WeightsRef
from tasks.stages import injects, save_checkpoint, sync
from tasks.transfer import trainer_weights


@dataclass(frozen=True)
class RolloutResult:
    """What a `rollout-<id>` flow run returns: the engines' weights after it, and how many task runs it
    started. At the end of the run, the parent waits for the server to have recorded those of the last rollout
    (`runtime.settle`)."""

    weights: WeightsRef
    task_runs: int


def run_tags(cfg: RunConfig) -> list[str]:
    """The Prefect tags of a run's flow runs, to filter runs by in the UI: rollflow, the recipe, the two backends,
    and ci-test when the assertion harness is on."""
    tags = ["rollflow", f"recipe:{cfg.recipe}", f"rollout:{cfg.rollout.rollout_backend}"]
    tags.append(f"train:{cfg.train.train_backend}")
    return [*tags, "ci-test"] if cfg.ci.ci_test else tags


def _run_name() -> str:
    return f"run/{flow_run.parameters['cfg'].name}"


# Prefect's validation of the parameters (pydantic over the whole RunConfig, before each flow run) is skipped:
# the parent passes a validated RunConfig. The body validates what comes as plain data (a run started through
# the API), as Prefect would have.
@flow(name="rollout", flow_run_name="rollout-{rollout_id}", log_prints=True, validate_parameters=False)
async def rollout_flow(
    cfg: RunConfig, rollout_id: int, weights: WeightsRef, session: str, refresh: list[str] | None = None
) -> RolloutResult:
    """One RL iteration: generate -> save-rollout -> log-prob -> train-step -> sync -> check (+ eval). Each
    stage is a task that runs its actor calls inside its own span. They run one after the other: on-policy,
    each needs the one before.

    --debug-rollout-only stops after save-rollout; --load-debug-rollout-data (train-only) loads a
    recording instead of generating and never syncs; --ci-inject-rollout-data-path generates, then
    checks the generation against the recording and trains on the recording."""
    if not isinstance(cfg, RunConfig) or not isinstance(weights, WeightsRef):
        cfg, weights = RunConfig.model_validate(cfg), WeightsRef.model_validate(weights)
        rollout_id = int(rollout_id)
    s, d = Stages(cfg, refresh or [], rollout_id), cfg.debug
    q = opaque_config(cfg)  # cfg as the tasks' argument
    if _evaluates_before(cfg, rollout_id):
        await s.eval(q, 0, weights)
    recording = d.load_debug_rollout_data or d.load_forge_rollout_data
    if recording:
        rollout = await s.load_rollout(q, rollout_id, recording, forge=bool(d.load_forge_rollout_data))
    else:
        injecting = injects(cfg, rollout_id)
        rollout = await s.generate(q, rollout_id, weights, fresh=injecting)
        if injecting:
            rollout = await s.inject(q, rollout_id, rollout)
    await s.save_rollout(q, rollout_id, rollout, loaded=bool(d.load_debug_rollout_data))
    steps: list[dict[str, Any]] = []
    logprobs: LogProbs | None = None
    if not cfg.rollout_only:
        logprobs = await s.log_prob(q, rollout_id, rollout, weights)
        steps = await s.train_step(q, rollout_id, rollout, logprobs.table, session)
        if not cfg.train_only:
            weights = await s.sync(q, rollout_id)
    synced = not cfg.train_only and not cfg.rollout_only
    await s.check(q, rollout_id, steps, weights if synced else None, logprobs.stats if logprobs else None)
    if _evaluates_after(cfg, rollout_id):
        await s.eval(q, rollout_id + 1, weights)
    return RolloutResult(weights, s.started)


@flow(name="rollflow-run", flow_run_name=_run_name, log_prints=True)
async def run_flow(
    cfg: RunConfig, refresh: list[str] | None = None, resume: bool = False, overwrite: bool = False
) -> dict[str, Any] | State:
    """The whole run: own the run dir, start Ray actors, then one `rollout-<id>` child flow run per rollout id.
    `resume` continues the run in `cfg`'s run dir where it was cut; `overwrite` replaces another run's records.

    As it goes, the run's report (`flows.report`) feeds the observers (the console of `rollflow run`) and the
    run's page in the Prefect UI (`flows.run_page`). At the end, with --ci-test, `rollflow doctor` runs on the
    run dir and its findings join both. With --ci-doctor gate (the default) an ERROR finding fails the run:
    the flow run ends Failed with the finding as its message. How the run ended is recorded in
    `<run dir>/outcome.json` (the root cause the console prints last). Log lines go to
    `<run dir>/logs/run.log`, the actors' output to logs/actors.log."""
    retry_busy_server_quickly()
    this = str(flow_run.get_id())
    # a Prefect retry of this flow run (UI, `prefect flow-run retry`) continues the run like --resume
    retry_of = this if (flow_run.run_count or 1) > 1 else None
    owned = runtime.own(cfg, resume=resume, overwrite=overwrite, retry_of=retry_of, flow_run_id=this)
    cfg = owned.cfg
    clear_outcome(cfg.resolved_run_dir)  # an earlier process's end is not this one's
    await runtime.crash_stale_flow_run(owned.previous_flow_run, current=this)
    runtime.record_flow_run(owned, this)
    faults = FaultInjector(
        cfg.faults.requests(), "orchestrator", None, str(cfg.resolved_run_dir), owned.info.started_at
    )
    if not owned.resumed:
        faults.log_pending()
    report = RunReport.load(cfg, owned.info.run_id, owned.start, _end(cfg, owned.start))
    page = run_page.RunPage(report, uuid.UUID(str(flow_run.get_id()))) if run_page.enabled() else None
    loop = _RunLoop(cfg, owned, report, page, faults, refresh or [])
    gate: str | None = None
    with runtime.run_log(cfg.resolved_run_dir), _listening(report), stop.stoppable(cfg, this):
        await _started(report, page)
        try:
            actors.ensure_ray(cfg)
            with actors.actor_logs_to(cfg.resolved_run_dir / "logs" / "actors.log"):
                weights = await loop.run()
            _dispose_gate(cfg, report)
            report.finish("completed" if report.done >= report.total else "stopped")
            write_outcome(cfg.resolved_run_dir, Outcome(report.status))
        except BaseException as e:
            line = stop.stopped_line(report.done, report.total, cfg.resolved_run_dir)
            if line is None:
                report.finish("failed", explain(e))
                write_outcome(cfg.resolved_run_dir, Outcome("failed", describe(e), stage_of(e)))
            else:  # Ctrl-C, SIGTERM or a cancel from Prefect
                report.finish("cancelled", line)
                write_outcome(cfg.resolved_run_dir, Outcome("cancelled", line))
                await _mark_interrupted(this, str(stop.stop_reason()))
            raise
        finally:
            faults.expire_unfired()
            close_run(cfg)  # trackers finished and plots/curves.png drawn, also when the run failed
            gate = _doctor(report)  # while the run dir is still this run's
            owned.release()
            await _wrap_up(report, page)
    if gate is not None:
        return Failed(message=gate)
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
    """The run's actors and its rollouts. Start the actors (restoring the trainers on a resume) and sync the
    first weights. Run one `rollout-<id>` child flow run per rollout. Stop the actors however it ends."""

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
        session = uuid.uuid4().hex
        self.publisher = runtime.Publisher(cfg, self.report.records, self.page)
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
            await self.publisher.drain()
            stop_actors(opaque_config(cfg))  # a task, on the parent's timeline
            if (
                last is not None
            ):  # task runs are recorded in order: the last rollout's last ones are the run's
                await runtime.settle(last[1], flow_run_id=last[0])
            ok = True
            return weights
        finally:
            if not ok:  # the run failed or was stopped: the actors go all the same
                await self.publisher.drain(raise_errors=False)
                actors.stop_actors(cfg)

    async def _start_actors(self) -> WeightsRef:
        """Engines and trainers started (trainers restored on a resume: the start-actors task), then the first
        weight sync (a sync task); the weights the engines hold."""
        cfg, owned = self.cfg, self.owned
        state = owned.trainer_state
        engines, trainers = await with_policy(cfg, start_actors)(
            opaque_config(cfg), str(state) if state else None
        )
        start = owned.start
        if state is not None and trainers:
            notify.notice(f"trainers restored from {state}; starting at rollout {start}")
        elif cfg.checkpoint.load and trainers:
            notify.notice(
                f"--load {cfg.checkpoint.load} holds no checkpoint yet: starting from "
                f"{actors.start_weights(cfg, None)}"
            )
        if engines and trainers:  # the weight-update checker runs at the run's first sync, not at a resume
            check_first_sync = cfg.ci.weight_check and not owned.resumed
            return await with_policy(cfg, sync)(opaque_config(cfg), start - 1, verify_equal=check_first_sync)
        if engines:  # rollout-only: the engines keep the weights they loaded, version 0
            return WeightsRef(version=0, sha256=await actors.engines(cfg)[0].weights_sha256.remote())
        # train-only: nothing to sync; identify the trainer's starting weights
        return WeightsRef(version=start, sha256=(await trainer_weights(cfg)).sha256)

    async def _rollout(
        self, rollout_id: int, weights: WeightsRef, session: str
    ) -> tuple[WeightsRef, tuple[uuid.UUID | None, int]]:
        """One child flow run, then the parent's share: a checkpoint when due, the rollout's wall time, the
        observers. Its Prefect artifacts (metrics table, run page) go to the publisher, posted in the
        background. Returns the weights after it, and its flow run id with the number of task runs it
        started."""
        cfg, report = self.cfg, self.report
        began = time.perf_counter()
        # the rollout a resume re-runs logs everything again: none of its stages may come from the cache
        stages = list(STAGES) if self.owned.resumed and rollout_id == self.owned.start else self.refresh
        state = await rollout_flow(
            cfg=cfg,
            rollout_id=rollout_id,
            weights=weights,
            session=session,
            refresh=stages,
            return_state=True,
        )
        result = await state.result()  # type: ignore[misc]  # raises the child's error
        assert isinstance(result, RolloutResult)
        child = state.state_details.flow_run_id
        last = rollout_id + 1 == report.end
        if not cfg.rollout_only and (_save_due(cfg, rollout_id) or (cfg.checkpoint.save and last)):
            await with_policy(cfg, save_checkpoint)(opaque_config(cfg), rollout_id)
        seconds = time.perf_counter() - began
        log_metrics(cfg, "perf", rollout_id, await run_memory(cfg))
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


async def _mark_interrupted(flow_run_id: str, reason: str) -> None:
    """`stop.mark_interrupted`, a failure of which is reported, never raised (the run is stopped already)."""
    try:
        await stop.mark_interrupted(flow_run_id, reason)
    except Exception as e:
        notify.notice(
            f"could not mark the interrupted runs Cancelled: {type(e).__name__}: {e}", logging.WARNING
        )


def _doctor(report: RunReport) -> str | None:
    """With --ci-test: the doctor's findings into the report. With --ci-doctor gate, an ERROR finding fails a run
    that otherwise ended well. It becomes the run's failure (report and outcome.json), and is returned as the
    message the flow run fails with."""
    cfg = report.cfg
    if not cfg.ci.ci_test:
        return None
    _diagnose(report)
    if cfg.ci.ci_doctor != "gate" or report.status not in ("completed", "stopped"):
        return None
    from flows.doctor import gate_failure

    line = gate_failure(report.findings or [])
    if line is not None:
        report.finish("failed", line)
        write_outcome(cfg.resolved_run_dir, Outcome("failed", line, gate="ci-doctor"))
    return line


async def _wrap_up(report: RunReport, page: run_page.RunPage | None) -> None:
    """However the run ended: the run page's last update, the observers told (the doctor's findings, with
    --ci-test, are in the report already). A failure here is reported, never raised: it must not hide how the run
    itself ended."""
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
