"""`rollflow doctor` names how a run ended: each planted failure (recorded in outcome.json as the run records it,
with the message the failing code itself makes) becomes the first finding; faults.jsonl is read; a run that failed
before its first rollout is diagnosed, not refused. Runs are synthetic (tests/doctor_runs.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from artifacts.rundir import Outcome, read_outcome, write_outcome
from artifacts.store import read_rollout
from flows.cli import main
from flows.doctor import Finding, diagnose, exit_code, gate_failure
from tests.doctor_runs import Plan, make_run, tokenizer_dir


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("tok"))


def _failed_run(tmp_path: Path, tokenizer: Path, error: str, where: str | None) -> Path:
    """A run of 4 rollouts (of --num-rollout 8) that ended with `error` raised at `where`."""
    run = make_run(
        tmp_path, tokenizer, dataclasses.replace(Plan(), rollouts=4, config={"rollout": {"num_rollout": 8}})
    )
    write_outcome(run, Outcome("failed", error, where))
    return run


def _first(run: Path) -> Finding:
    return diagnose(run)[0]


def test_the_outcome_record_round_trips_and_a_damaged_one_is_none(tmp_path):
    write_outcome(tmp_path, Outcome("failed", "ValueError: x", "rollout 1, stage generate"))
    assert read_outcome(tmp_path) == Outcome("failed", "ValueError: x", "rollout 1, stage generate")
    (tmp_path / "outcome.json").write_text("[1]")
    assert read_outcome(tmp_path) is None


def test_engines_out_of_sync_at_the_always_on_check_are_named_with_the_check_s_message(tmp_path, tokenizer):
    from tasks.checks import EngineWeights, out_of_sync_message

    message = out_of_sync_message(3, 4, "a" * 64, [EngineWeights(0, 4, "b" * 64)], None)
    run = _failed_run(tmp_path, tokenizer, f"CheckFailed: {message}", "rollout 3, stage check")
    first = _first(run)
    assert (first.severity, first.rule) == ("error", "engines-in-sync")
    assert first.title == (
        "the always-on engines-in-sync check failed at rollout 3, stage check: the engines do not hold the "
        "trainer's weights after the sync (a weight transfer that did not apply, or an engine that changed its own)"
    )
    assert first.evidence == f"CheckFailed: {message} (rollout 3, stage check)"
    assert f"rollflow replay {run} --rollout-id 3 --task sync" in first.knife
    assert exit_code(diagnose(run)) == 1


def test_the_inject_guard_s_mismatch_is_named_with_its_message(tmp_path, tokenizer):
    from rollout.replay import InjectionMismatch, check_injection

    recorded = read_rollout(
        make_run(tmp_path / "rec", tokenizer, dataclasses.replace(Plan(), rollouts=1))
        / "rollouts"
        / "rollout_000000.parquet"
    )
    fresh = [
        dataclasses.replace(s, prompt_tokens=[*s.prompt_tokens[:-1], s.prompt_tokens[-1] + 1])
        for s in recorded
    ]
    with pytest.raises(InjectionMismatch) as planted:
        check_injection(fresh, recorded, 0.9)
    run = _failed_run(tmp_path, tokenizer, f"InjectionMismatch: {planted.value}", "rollout 0, stage inject")
    first = _first(run)
    assert (first.severity, first.rule) == ("error", "inject-guard")
    assert first.title == (
        "the inject match guard stopped the run at rollout 0, stage inject: the engines' fresh generation does "
        f"not match the injected recording ({planted.value})"
    )
    assert "rollflow check-template --hf-checkpoint" in first.knife


def test_a_stage_error_is_named_with_its_stage_and_replay(tmp_path, tokenizer):
    run = _failed_run(tmp_path, tokenizer, "ZeroDivisionError: division by zero", "rollout 2, stage log-prob")
    first = _first(run)
    assert (first.severity, first.rule) == ("error", "run-failure")
    assert first.title == "the run failed at rollout 2, stage log-prob: ZeroDivisionError: division by zero"
    assert first.knife == (
        f"the traceback in {run}/logs/run.log; rollflow replay {run} --rollout-id 2 --task log-prob"
    )


def _fault_line(run: Path, request: str, status: str, action: str = "kill", **extra) -> None:
    event = {
        "request_id": request,
        "hook": "engine_generate_start",
        "action": action,
        "status": status,
        "process": "engine-0",
        "context": {"rollout_id": 1, "stage": "generate"},
        **extra,
    }
    with open(run / "faults.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def test_a_fault_that_fired_before_the_failure_is_named_in_it(tmp_path, tokenizer):
    run = _failed_run(tmp_path, tokenizer, "ActorDiedError: the actor died", "rollout 1, stage generate")
    _fault_line(run, "k1", "pending")
    _fault_line(run, "k1", "reached")
    _fault_line(run, "k1", "fired")
    findings = diagnose(run)
    assert findings[0].title == (
        "the run failed at rollout 1, stage generate: ActorDiedError: the actor died; injected fault request k1 "
        "(kill at engine_generate_start in engine-0, rollout 1) fired before it (faults.jsonl)"
    )
    assert not [f for f in findings if f.rule == "fault"]  # named once, in the failure


def test_faults_of_a_run_that_went_on_are_information_and_one_that_could_not_act_a_warning(
    tmp_path, tokenizer
):
    run = make_run(
        tmp_path, tokenizer, dataclasses.replace(Plan(), rollouts=4, config={"rollout": {"num_rollout": 4}})
    )
    write_outcome(run, Outcome("completed"))
    _fault_line(run, "k1", "fired")
    _fault_line(run, "s1", "failed", action="sigstop", error="PermissionError: no")
    _fault_line(run, "e1", "expired")
    faults = [(f.severity, f.title) for f in diagnose(run) if f.rule == "fault"]
    assert faults == [
        (
            "warning",
            "injected fault request s1 (sigstop at engine_generate_start in engine-0, rollout 1) could not act: PermissionError: no",
        ),
        (
            "info",
            "injected fault request k1 (kill at engine_generate_start in engine-0, rollout 1) fired and the run went on past it",
        ),
        ("info", "injected fault request e1 (engine_generate_start) never fired"),
    ]
    assert exit_code(diagnose(run)) == 0


def test_a_raise_fault_that_failed_the_run_is_the_direct_cause(tmp_path, tokenizer):
    message = (
        "fault hook r1: raise at orchestrator_train_step_end in orchestrator rollout_id 2: injected failure"
    )
    run = _failed_run(tmp_path, tokenizer, f"FiredFault: {message}", "rollout 2, stage train-step")
    first = _first(run)
    assert (first.rule, first.title) == (
        "fault",
        f"an injected fault failed the run at rollout 2, stage train-step: {message}",
    )


def test_a_run_that_failed_before_its_first_rollout_is_diagnosed_from_its_outcome(
    tmp_path, tokenizer, capsys
):
    run = make_run(
        tmp_path,
        tokenizer,
        dataclasses.replace(Plan(), rollouts=1, config={"checkpoint": {"load": str(tmp_path / "ckpt")}}),
    )
    for p in (run / "rollouts").iterdir():
        p.unlink()
    (run / "metrics.jsonl").unlink()
    write_outcome(run, Outcome("failed", "RuntimeError: size mismatch for model.norm.weight"))
    assert main(["doctor", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "1. ERROR [run-failure] the run failed before its first rollout (starting the actors and their weights): "
        "RuntimeError: size mismatch for model.norm.weight"
    )
    assert (
        out[3]
        == f"   confirm:  the traceback in {run}/logs/run.log; rollflow lint-ckpt {tmp_path / 'ckpt'} (the --load checkpoint)"
    )


def test_a_doctor_gate_failure_is_not_reported_twice(tmp_path, tokenizer):
    run = make_run(
        tmp_path, tokenizer, dataclasses.replace(Plan(), rollouts=2, config={"rollout": {"num_rollout": 2}})
    )
    write_outcome(run, Outcome("failed", "the doctor found an ERROR ...", gate="ci-doctor"))
    assert [f for f in diagnose(run) if f.severity != "info"] == []


def test_the_gate_line_names_the_first_error_and_counts_the_rest():
    findings = [
        Finding("warning", "w", "e0", "k", "entropy"),
        Finding("error", "responses are cut", "ratio 1.0", "k", "truncation"),
        Finding("error", "x", "e2", "k", "spike"),
    ]
    assert gate_failure(findings) == (
        "the doctor found an ERROR [truncation] responses are cut (evidence: ratio 1.0); 1 more error(s) in "
        "`rollflow doctor` (--ci-doctor advisory reports without failing)"
    )
    assert gate_failure(findings[:1]) is None


def test_a_run_that_recorded_no_outcome_is_named_from_its_log_s_last_traceback(tmp_path, tokenizer, capsys):
    run = make_run(tmp_path, tokenizer, dataclasses.replace(Plan(), rollouts=1))
    for p in (run / "rollouts").iterdir():
        p.unlink()
    (run / "metrics.jsonl").unlink()
    (run / "logs").mkdir()
    (run / "logs" / "run.log").write_text(
        "05:05:57.016 | ERROR   | Flow run 'rollflow-run' - Encountered exception during execution\n"
        "Traceback (most recent call last):\n"
        '  File "trainers/core.py", line 10, in load\n'
        "    raise KeyError(name)\n"
        "KeyError: 'model.norm.weight'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "trainers/core.py", line 12, in load\n'
        "    raise RuntimeError(...)\n"
        "trainers.core.LoadError: --load /ckpt/iter_0000003: tensor model.norm.weight missing\n"
        "05:05:57.038 | ERROR   | Flow run 'rollflow-run' - Finished in state Failed(...)\n"
    )
    assert main(["doctor", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "1. ERROR [run-failure] the run failed before its first rollout (starting the actors and their weights): "
        "LoadError: --load /ckpt/iter_0000003: tensor model.norm.weight missing"
    )
    assert out[2] == (
        "   evidence: LoadError: --load /ckpt/iter_0000003: tensor model.norm.weight missing (the last traceback in "
        "logs/run.log: the run recorded no outcome.json)"
    )


@pytest.mark.parametrize("mode", ["gate", "advisory"])
def test_the_end_of_a_ci_test_run_fails_on_a_doctor_error_unless_advisory(tmp_path, tokenizer, mode):
    from config import RunConfig, load_yaml
    from flows.report import RunReport
    from flows.run import _doctor

    # planted: a reward that ignores the response (no checker catches it; the doctor does)
    plan = dataclasses.replace(
        Plan(), reward=lambda rid, g, j: 1.0, config={"ci": {"ci_test": True, "ci_doctor": mode}}
    )
    run = make_run(tmp_path, tokenizer, plan)
    report = RunReport(RunConfig.model_validate(load_yaml(run / "config.yaml")), "r", 0, 12)
    report.finish("completed")
    write_outcome(run, Outcome("completed"))
    line = _doctor(report)
    assert report.findings and report.findings[0].rule == "constant-reward"
    if mode == "advisory":
        assert line is None and report.status == "completed" and read_outcome(run) == Outcome("completed")
        return
    assert line is not None and line.startswith(
        "the doctor found an ERROR [constant-reward] every sample gets"
    )
    assert (report.status, report.failure) == ("failed", line)
    assert read_outcome(run) == Outcome("failed", line, gate="ci-doctor")


def test_a_checker_failure_is_named_once_with_the_checker_s_line(tmp_path, tokenizer):
    from artifacts.store import append_metrics

    line = "[KL checker] train/ppo_kl = 0.0123 violates |x| < 1e-9 at rollout 4 step 8"
    run = _failed_run(tmp_path, tokenizer, f"CheckFailed: {line}", "rollout 4, stage check")
    append_metrics(
        run / "metrics.jsonl", {"kind": "check", "rollout_id": 4, "metrics": {"check/violations": 1.0}}
    )
    checkers = [f for f in diagnose(run) if f.rule == "checker"]
    assert [(f.title, f.knife) for f in checkers] == [
        (
            f"a checker stopped the run at rollout 4, stage check: {line}",
            f"the checker's line names metric, value and tolerance; rollflow replay {run} --rollout-id 4 --task check",
        )
    ]
