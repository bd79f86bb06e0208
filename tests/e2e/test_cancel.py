"""Stopping a run: Ctrl-C (SIGINT to the terminal's whole process group), SIGTERM to the driver, and a cancel from
Prefect (`prefect flow-run cancel`, as the UI's Cancel does it) each end `rollflow run` within seconds on one line,
no traceback: its processes gone, its flow runs Cancelled (none Crashed), and the run resumable from its last
complete rollout, identical to a run never stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifacts.rundir import completed_rollouts, read_outcome
from flows.diff import first_divergence
from flows.reaper import _descendants, _stat
from tests.e2e.test_resume import ROOT, _env, _flags, _records

pytestmark = pytest.mark.e2e


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`rollflow run ARGS` in a session of its own, as a terminal runs it in a process group of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _wait_for_step(driver: subprocess.Popen, run_dir: Path, rollout_id: int) -> None:
    """Until the run has logged a train step of rollout `rollout_id` (it is inside that rollout)."""
    deadline = time.monotonic() + 600
    while not any(r["kind"] == "step" and r["rollout_id"] >= rollout_id for r in _records(run_dir)):
        assert driver.poll() is None and time.monotonic() < deadline, (
            driver.stdout.read() if driver.stdout else ""
        )
        time.sleep(0.05)


def _stopped(driver: subprocess.Popen, tree: dict[int, int], code: int, reason: str) -> str:
    """The driver's output once it exited with `code`, its last line the stop line for `reason`, no traceback; and
    every process it started gone soon after."""
    out, _ = driver.communicate(timeout=120)  # a hang guard, not a timing
    assert driver.returncode == code, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"rollflow: stopped by {reason} in rollout "), out[-3000:]
    assert "continue with `rollflow run --resume" in last
    assert "Traceback" not in out and "TerminationSignal" not in out and "CancelledError" not in out, out[
        -3000:
    ]
    gone_by = time.monotonic() + 30
    while left := [
        p for p, start in tree.items() if (st := _stat(p)) is not None and st[1] == start and st[2] != "Z"
    ]:
        assert time.monotonic() < gone_by, f"processes of the stopped run still alive: {left}"
        time.sleep(0.2)
    return out


def test_ctrl_c_stops_a_run_that_then_resumes_identical_to_a_straight_run(
    tmp_path, prefect_home, base_checkpoint, straight_run
):
    env, straight = _env(prefect_home), straight_run
    cut = tmp_path / "cut"
    driver = _start(["--name", "cut", *_flags(base_checkpoint, cut)], env)
    _wait_for_step(driver, cut, 2)
    tree = _descendants(driver.pid)
    os.killpg(driver.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out = _stopped(driver, tree, 130, "Ctrl-C")
    assert "cancelled" in out  # the summary's status

    resumed = _start(["--resume", str(cut)], env)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    assert (
        "resuming run" in out and "Crashed" not in out
    )  # a stopped run's flow runs are final: none left to mark
    assert first_divergence(straight, cut) is None
    steps = [(r["rollout_id"], r["step"]) for r in _records(cut) if r["kind"] == "step"]
    assert steps == sorted(set(steps)) and len(steps) == 8  # the rollout that was cut is not logged twice


async def _states(name: str) -> tuple[list, dict[str, list], list]:
    """The parent flow runs named `run/<name>`, the rollout flow runs of each, and their task runs (newest first)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName
    from prefect.client.schemas.filters import FlowRunFilterParentFlowRunId as ParentId

    async with get_client() as client:
        parents = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[f"run/{name}"]))
        )
        children = {
            str(p.id): await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=ParentId(any_=[p.id]))
            )
            for p in parents
        }
        ids = [p.id for p in parents] + [c.id for runs in children.values() for c in runs]
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    return parents, children, tasks


async def _history(flow_run_id) -> list[tuple[str, str, str]]:
    """A flow run's states, oldest first: (type, message, timestamp)."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        states = await client.read_flow_run_states(flow_run_id)
    return [(s.type.value, s.message or "", str(s.timestamp)) for s in states]


def _server_env(prefect_home: Path) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {**_env(prefect_home), "PREFECT_API_URL": str(PREFECT_API_URL.value())}


def test_sigterm_and_a_cancel_from_prefect_stop_a_cli_run_on_a_server(
    tmp_path, prefect_home, base_checkpoint
):
    env = _server_env(prefect_home)
    run_dir, name = tmp_path / "stopped", f"stopped-{os.getpid()}"
    flags = _flags(base_checkpoint, run_dir)
    flags[flags.index("--num-rollout") + 1] = "40"
    driver = _start(["--name", name, *flags], env)
    _wait_for_step(driver, run_dir, 1)
    tree = _descendants(driver.pid)
    os.kill(driver.pid, signal.SIGTERM)
    _stopped(driver, tree, 143, "SIGTERM")

    # the same run, resumed, then cancelled from Prefect while it runs
    driver = _start(["--resume", str(run_dir)], env)
    before = max(r["rollout_id"] for r in _records(run_dir) if r["kind"] == "step")
    _wait_for_step(driver, run_dir, before + 2)
    parents, _, _ = asyncio.run(_states(name))
    running = [p for p in parents if p.state is not None and p.state.is_running()]
    assert len(running) == 1
    tree = _descendants(driver.pid)
    cancel = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "cancel", str(running[0].id)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    _stopped(driver, tree, 1, "a cancel from Prefect")

    parents, children, tasks = asyncio.run(_states(name))
    assert [p.state.type.value for p in parents] == ["CANCELLED", "CANCELLED"]
    for runs in children.values():  # each stop cancelled the rollout it was in; the rollouts before completed
        kinds = sorted(c.state.type.value for c in runs)
        assert kinds.count("CANCELLED") <= 1 and set(kinds) <= {"COMPLETED", "CANCELLED"}, kinds
    crashed = [
        (t.name, t.state.message, str(t.state.timestamp)) for t in tasks if t.state and t.state.is_crashed()
    ]
    assert not crashed
    steps = [r["rollout_id"] for r in _records(run_dir) if r["kind"] == "step"]
    assert steps == sorted(
        steps
    )  # the rollouts cut by each stop were dropped at the resume, never logged twice


# where the served run's driver holds (a 15 s sleep) while the cancel comes, and the rollout the stop lands in
HOLDS = {
    # rollout 1 recorded, rollout 2 not started: no rollout flow run holds Prefect's SIGTERM bridge, and Ray's
    # handler would have replaced the run's
    "between-rollouts": ("orchestrator_rollout_end", 2),
    # inside rollout 1's flow run, at the end of its train-step task, before its step is logged
    "inside-a-rollout": ("orchestrator_train_step_end", 1),
}


@pytest.mark.parametrize("where", list(HOLDS))
def test_a_cancel_from_prefect_stops_a_served_run(where, tmp_path, prefect_home, base_checkpoint):
    """A deployment's flow run, run by `rollflow serve` in a subprocess of its own, is cancelled by its runner,
    between two rollouts or inside one: the run records the stop as a cancel. Cancelled, with its rollout flow
    runs and task runs final and none Crashed, its actors gone, the rollout it was in not counted as complete."""
    from prefect.deployments import run_deployment

    from config import dump_yaml
    from flows.cli import build_config, make_parser

    env = _server_env(prefect_home)
    run_dir, name = tmp_path / "served", f"served-{os.getpid()}-{where}"
    flags = _flags(base_checkpoint, run_dir)
    flags[flags.index("--num-rollout") + 1] = "40"
    hook, stopped_in = HOLDS[where]
    hold = {
        "request_id": "hold",
        "hook_name": hook,
        "action": {"kind": "sleep", "seconds": 15},
        "rollout_id": 1,
    }
    flags += ["--ci-fault-hooks", json.dumps([hold])]
    config = tmp_path / "served.yaml"
    config.write_text(dump_yaml(build_config(make_parser().parse_args(["run", "--name", name, *flags]))))
    log = (
        tmp_path / "serve.log"
    )  # a file, not a pipe: a full pipe would stall the runner that relays the run's output
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        env={**env, "PREFECT_RUNNER_POLL_FREQUENCY": "2"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:  # until serve has registered its deployment
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                run = run_deployment(_served_deployment(name), timeout=0)
                break
            except Exception:
                time.sleep(2)
        while not _fired(run_dir, "hold"):
            assert serve.poll() is None and time.monotonic() < deadline + 300, (
                "the served run made no progress"
            )
            time.sleep(0.2)
        workers = _descendants(serve.pid)
        asyncio.run(_cancel(run.id))  # as the UI's Cancel: the runner sees it within its poll (2 s here)
        deadline = time.monotonic() + 120
        while True:
            parents, children, tasks = asyncio.run(_states(name))
            if parents and parents[0].state.is_final() and not [t for t in tasks if not t.state.is_final()]:
                break
            assert time.monotonic() < deadline, (
                [p.state for p in parents],
                [(t.name, t.state) for t in tasks if not t.state.is_final()],
            )
            time.sleep(1)
        assert parents[0].state.type.value == "CANCELLED", (
            asyncio.run(_history(parents[0].id)),
            log.read_text()[-6000:],
        )
        assert not [(t.name, t.state.message) for t in tasks if t.state.is_crashed()]
        for runs in children.values():
            assert {c.state.type.value for c in runs} <= {"COMPLETED", "CANCELLED"}
        outcome = read_outcome(run_dir)
        assert outcome is not None and outcome.status == "cancelled", (outcome, log.read_text()[-6000:])
        assert outcome.error.startswith(f"stopped by a cancel from Prefect in rollout {stopped_in} "), (
            outcome.error
        )
        assert completed_rollouts(_records(run_dir)) == stopped_in  # a resume starts at the rollout it was in
        gone_by = time.monotonic() + 60  # the flow run's process and the Ray it started
        while left := [
            p for p, s in workers.items() if (st := _stat(p)) is not None and st[1] == s and st[2] != "Z"
        ]:
            assert time.monotonic() < gone_by, f"processes of the cancelled run still alive: {left}"
            time.sleep(0.5)
        assert serve.poll() is None  # serve itself goes on serving
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)


def _fired(run_dir: Path, request_id: str) -> bool:
    """Whether the run's fault request `request_id` has fired (faults.jsonl)."""
    log = run_dir / "faults.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return any(
        (r := json.loads(line))["request_id"] == request_id and r["status"] == "fired" for line in lines
    )


async def _cancel(flow_run_id) -> None:
    """Ask Prefect to cancel flow run `flow_run_id`, as the UI's Cancel does (`prefect flow-run cancel`)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    async with get_client() as client:
        result = await client.set_flow_run_state(flow_run_id, Cancelling())
    assert result.status.value == "ACCEPT", result


def _served_deployment(name: str) -> str:
    """The run deployment `rollflow serve` serves for the config named `name`."""
    from config import RunConfig
    from deployments.serve import run_deployment_name

    return f"rollflow-run/{run_deployment_name(RunConfig(name=name))}"
