"""A Prefect retry of a run's parent flow run (the UI's Retry, `prefect flow-run retry`) resumes only the run that
flow run recorded: it starts afresh where nothing was recorded yet, and refuses another run's records by name."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from artifacts import rundir
from config import RunConfig
from flows import runtime
from tests.unit.test_resume_state import _checkpoint
from trainers.actor import snapshot_dir


def _cfg(tmp_path: Path) -> RunConfig:
    return RunConfig.model_validate({"name": "retried", "run_dir": str(tmp_path / "run")})


def _recorded(tmp_path: Path, flow_run_id: str, completed: int) -> rundir.RunInfo:
    """A run dir whose run (parent flow run `flow_run_id`) completed `completed` rollouts."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    info = replace(rundir.new_info("retried"), flow_run_id=flow_run_id)
    rundir.write_info(run_dir, info)
    lines = [
        {"kind": "perf", "run_id": info.run_id, "rollout_id": r, "metrics": {"perf/step_time": 1.0}}
        for r in range(completed)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _checkpoint(snapshot_dir(run_dir) / f"iter_{completed - 1:07d}", completed - 1)  # the trainers' state
    return info


def test_a_retry_resumes_the_run_its_own_flow_run_recorded(tmp_path):
    info = _recorded(tmp_path, "flow-a", completed=3)
    owned = runtime.own(_cfg(tmp_path), retry_of="flow-a")
    try:
        assert owned.resumed and owned.start == 3 and owned.info.run_id == info.run_id
        assert owned.previous_flow_run == "flow-a"
    finally:
        owned.release()


def test_a_retry_of_a_run_that_recorded_nothing_starts_it_afresh(tmp_path):
    owned = runtime.own(_cfg(tmp_path), retry_of="flow-a")
    try:
        assert not owned.resumed and owned.start == 0
    finally:
        owned.release()


def test_a_retry_refuses_another_runs_records_naming_both(tmp_path):
    info = _recorded(tmp_path, "flow-a", completed=2)
    with pytest.raises(
        ValueError, match=rf"records of run {info.run_id} \(flow run flow-a\), not of flow run flow-b"
    ):
        runtime.own(_cfg(tmp_path), retry_of="flow-b")
    assert (
        rundir.completed_rollouts(
            [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        )
        == 2
    )  # nothing of the other run was touched


def test_a_retry_with_overwrite_replaces_another_runs_records(tmp_path):
    _recorded(tmp_path, "flow-a", completed=2)
    owned = runtime.own(_cfg(tmp_path), retry_of="flow-b", overwrite=True)
    try:
        assert not owned.resumed and owned.start == 0 and not rundir.has_records(tmp_path / "run")
    finally:
        owned.release()


def test_a_deployments_runs_each_get_a_run_dir_of_their_own(monkeypatch):
    # two flow runs a schedule created at once (Prefect's ids are UUIDv7: the same time, in the first digits)
    first, second = "01a2446b-a0b8-790b-85ca-5d344b3b19d2", "01a2446b-a0b8-7177-b86d-d3f0d1238c5b"
    cfg = RunConfig.model_validate({"name": "nightly"})
    assert runtime.deployment_run_dir(cfg, first, resume=False) is cfg  # not a deployment's run
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__ID", "9f8e7d6c-0000-0000-0000-000000000000")
    assert runtime.deployment_run_dir(cfg, first, resume=False).run_dir == "runs/nightly-4b3b19d2"
    assert runtime.deployment_run_dir(cfg, second, resume=False).run_dir == "runs/nightly-d1238c5b"
    assert runtime.deployment_run_dir(cfg, first, resume=True) is cfg  # continues runs/nightly
    named = RunConfig.model_validate({"name": "nightly", "run_dir": "/data/nightly"})
    assert runtime.deployment_run_dir(named, first, resume=False) is named
