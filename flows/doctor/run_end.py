"""Doctor rules over how a run ended: the root cause it failed with, and the faults it injected
(faults.jsonl). The root cause is in outcome.json, the line the console printed last: an always-on check, the
inject guard, a checker, a stage's error, a failure before the first rollout. A failure leaves no metric
record behind. So without these rules the doctor of a failed run would only see that it stopped early."""

from __future__ import annotations

import re
from typing import Any

from config.stages import REPLAYABLE
from flows.doctor.findings import DIRECT, POINTED, SYMPTOM, Finding
from flows.doctor.run_data import RunData

_WHERE = re.compile(r"rollout (\d+), stage ([\w-]+)")
IN_SYNC = "do not hold the trainer's weights after the sync"  # tasks.checks.out_of_sync_message
NON_FINITE = "non-finite training metrics"  # the check task's always-on finite-metrics check


def _fault(event: dict[str, Any]) -> str:
    """`request r1 (raise at engine_generate_start in engine-0, rollout 0)`."""
    ctx = event.get("context") or {}
    at = f", rollout {ctx['rollout_id']}" if isinstance(ctx, dict) and "rollout_id" in ctx else ""
    return (
        f"request {event['request_id']} ({event.get('action')} at {event.get('hook')} in "
        f"{event.get('process')}{at})"
    )


def _fired(run: RunData) -> list[dict[str, Any]]:
    return [e for e in run.fault_events if e["status"] == "fired"]


def _replay(run: RunData, rollout: str | None, stage: str | None) -> str:
    if rollout is None or stage not in REPLAYABLE:
        return ""
    return f"; rollflow replay {run.dir} --rollout-id {rollout} --task {stage}"


def failure(run: RunData) -> list[Finding]:
    """The run's recorded failure, named by what raised it: the always-on engines-in-sync or finite-metrics
    check, the inject match guard, a --ci-test checker, an injected fault, any other stage error, or a failure
    before the first rollout (e.g. restoring --load). The evidence is the root cause exactly as the console
    printed it. A `--ci-doctor gate` failure is left out: it is the doctor's own finding, reported by its rule."""
    o = run.outcome
    if o is None or o.status in ("completed", "stopped") or o.gate:
        return []
    log = f"{run.dir}/logs/run.log"
    if o.status == "cancelled":
        return [
            Finding("info", f"the run was cancelled: {o.error}", "outcome.json", "-", "run-failure", SYMPTOM)
        ]
    error = o.error or "no error recorded"
    kind, _, message = error.partition(": ")
    found = _WHERE.search(o.where or "")
    rollout, stage = found.groups() if found else (None, None)
    evidence = error + (f" ({o.where})" if o.where else "")
    if run.outcome_source != "outcome.json":  # no outcome recorded: the log's last traceback stands in for it
        evidence += f" (the last traceback in {run.outcome_source}: the run recorded no outcome.json)"
    at = f" at rollout {rollout}, stage {stage}" if found else ""
    replay = _replay(run, rollout, stage)
    if kind == "CheckFailed" and IN_SYNC in message:
        return [
            Finding(
                "error",
                f"the always-on engines-in-sync check failed{at}: the engines do not hold the trainer's weights "
                "after the sync (a weight transfer that did not apply, or an engine that changed its own)",
                evidence,
                f"rollflow run --check-weight-update-equal --num-rollout 1 (names every tensor the transfer "
                f"gets wrong){_replay(run, rollout, 'sync')}",
                "engines-in-sync",
                POINTED,
            )
        ]
    if kind == "CheckFailed" and NON_FINITE in message:
        return [
            Finding(
                "error",
                f"the always-on finite-metrics check failed{at}: {message}",
                evidence,
                f"rollflow replay {run.dir} --rollout-id {rollout} --task train-step (the same step from the "
                f"recorded rollout)"
                if rollout is not None
                else log,
                "non-finite",
                POINTED,
            )
        ]
    if (
        kind == "CheckFailed"
    ):  # a --ci-test checker or the accuracy gate: its record says where, this says what
        return [
            Finding(
                "error",
                f"a checker stopped the run{at}: {message}",
                evidence,
                f"the checker's line names metric, value and tolerance{replay}",
                "checker",
                SYMPTOM,
            )
        ]
    if kind == "InjectionMismatch":
        return [
            Finding(
                "error",
                f"the inject match guard stopped the run{at}: the engines' fresh generation does not match the "
                f"injected recording ({message})",
                evidence,
                f"rollflow check-template --hf-checkpoint {run.cfg('hf_checkpoint', 'MODEL')} (the prompt as the "
                f"engine renders it); rollflow replay {run.dir} --rollout-id {rollout or 0} --task generate",
                "inject-guard",
                POINTED,
            )
        ]
    if kind == "FiredFault":
        return [
            Finding(
                "error",
                f"an injected fault failed the run{at}: {message}",
                evidence,
                f"{run.dir}/faults.jsonl and the run's --ci-fault-hooks (a fault the run was expected to "
                "survive: the retry that should have recovered it)",
                "fault",
                DIRECT,
            )
        ]
    fired = _fired(run)
    after = f"; injected fault {_fault(fired[-1])} fired before it (faults.jsonl)" if fired else ""
    load = run.cfg("checkpoint.load")
    if not found and not run.rollout_ids and not run.records:
        title = f"the run failed before its first rollout (starting the actors and their weights): {error}"
        knife = f"the traceback in {log}" + (
            f"; rollflow lint-ckpt {load} (the --load checkpoint)" if load else ""
        )
    else:
        title = f"the run failed{at}: {error}"
        knife = f"the traceback in {log}{replay}"
    return [Finding("error", title + after, evidence, knife, "run-failure", DIRECT)]


def faults(run: RunData) -> list[Finding]:
    """The faults the run injected (faults.jsonl). One whose action could not be carried out is a warning: the
    survival it meant to test was not tested. One that fired in a run that did not fail, or never fired, is
    information. A fault that fired before a failure is named in the failure's finding."""
    out = []
    last: dict[str, dict[str, Any]] = {}
    for event in run.fault_events:
        if event["status"] == "failed":
            out.append(
                Finding(
                    "warning",
                    f"injected fault {_fault(event)} could not act: {event.get('error', 'no error recorded')}",
                    f"{run.dir}/faults.jsonl",
                    "the fault's action and its target process",
                    "fault",
                    SYMPTOM,
                )
            )
        if last.get(event["request_id"], {}).get("status") != "fired":
            last[event["request_id"]] = event
    failed = run.outcome is not None and run.outcome.status == "failed" and not run.outcome.gate
    for event in last.values():
        if event["status"] == "fired" and not failed:
            title = f"injected fault {_fault(event)} fired and the run went on past it"
        elif event["status"] in ("pending", "expired"):
            title = f"injected fault request {event['request_id']} ({event.get('hook')}) never fired"
        else:
            continue
        out.append(Finding("info", title, f"{run.dir}/faults.jsonl", "-", "fault", SYMPTOM))
    return out
