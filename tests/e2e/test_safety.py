"""Safe by default: servers rollflow starts listen on loopback only, Ray refuses a client without the run's
token, a run dir belongs to one run at a time, and the accuracy gate never reads another run's evals."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.reaper import _descendants
from tests.e2e.test_loop import small_config
from tests.e2e.test_resume import ROOT, _env, _rollflow

pytestmark = pytest.mark.e2e

LOOPBACK = ("127.0.0.1", "[::1]", "::1")


def _listeners(pids: set[int]) -> dict[int, list[str]]:
    """{pid: [local address:port of each listening TCP socket]} of `pids`, read from `ss -ltnp`."""
    out: dict[int, list[str]] = {}
    for line in subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        fields = line.split()
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids:
                out.setdefault(pid, []).append(fields[3])
    return out


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def test_loopback_servers_ray_token_and_one_run_per_dir(tmp_path, base_checkpoint):
    env = _env(tmp_path / "prefect")  # a new Prefect home, as a user's first run has
    run_dir = tmp_path / "paused"
    pause = [
        {
            "request_id": "pause",
            "hook_name": "trainer_step_before_allreduce",
            "action": {"kind": "sleep", "seconds": 300.0},
            "rollout_id": 1,
        }
    ]
    flags = [
        "--name",
        "paused",
        "--run-dir",
        str(run_dir),
        "--hf-checkpoint",
        base_checkpoint,
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "8",
        "--data-parallel-size",
        "2",
        "--eval-interval",
        "none",
        "--ci-fault-hooks",
        json.dumps(pause),
    ]
    run = _rollflow(flags, env)
    deadline = time.monotonic() + 300
    log = run_dir / "faults.jsonl"
    while not (log.is_file() and '"fired"' in log.read_text()):
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read() if run.stdout else ""
        time.sleep(0.2)
    time.sleep(1.0)
    try:
        tree = set(_descendants(run.pid))
        listeners = _listeners(tree)
        names = {pid: _cmdline(pid) for pid in listeners}
        prefect = [pid for pid, cmd in names.items() if "uvicorn" in cmd and "prefect" in cmd]
        assert prefect and all(a.startswith(LOOPBACK) for pid in prefect for a in listeners[pid])
        # a Ray worker has one listener of Ray's own on every interface (its core worker port; the token guards
        # it); anything a trainer opens itself (the rendezvous, gloo's connections) must be on loopback
        workers = [
            pid for pid, cmd in names.items() if cmd.startswith(("ray::TrainerActor", "ray::EngineActor"))
        ]
        assert len(workers) >= 3  # two trainer ranks and an engine
        for pid in workers:
            wide = [a for a in listeners[pid] if not a.startswith(LOOPBACK)]
            assert len(wide) == 1, f"{names[pid]} (pid {pid}) listens on {wide}"

        # a Ray client without the run's token is refused
        raylet = next(_cmdline(pid) for pid in tree if "raylet" in _cmdline(pid).split()[0])
        found = re.search(r"--gcs-address=(\S+)", raylet)
        assert found
        address = found.group(1)
        probe = f"import ray; ray.init(address={address!r}, log_to_driver=False); print('CONNECTED')"
        for token_env in (
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
            {"RAY_AUTH_MODE": "disabled"},
        ):
            intruder = {k: v for k, v in env.items() if not k.startswith("RAY_")}
            # Ray retries a refused connection for ~20 s (one attempt a second) before it gives up; two
            # attempts show the refusal as well
            intruder.update(
                {**token_env, "HOME": str(tmp_path / "home"), "RAY_gcs_server_port_wait_time_s": "2"}
            )
            done = subprocess.run(
                [sys.executable, "-c", probe], env=intruder, capture_output=True, text=True, timeout=120
            )
            assert "CONNECTED" not in done.stdout and done.returncode != 0
            assert "Authentication" in done.stderr or "auth" in done.stderr.lower(), done.stderr[-1500:]

        # a second run into the same run dir fails at once, naming the first
        began = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2 and time.monotonic() - began < 60
        assert f"in use by pid {run.pid}" in second.stderr
    finally:
        run.kill()  # paused for minutes on purpose; the reaper stops its Prefect server and Ray
        run.communicate(timeout=60)


def test_the_gate_never_reads_another_runs_evals(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.run import run_flow

    gate = {"ci_metric_checker_key": "eval/tiny-arith", "ci_metric_checker_threshold": 0.0}
    first = small_config(tmp_path, base_checkpoint, rollout={"num_rollout": 1}, ci=gate)
    asyncio.run(run_flow(first))  # evals at 0 and 1: the gate passes
    no_eval = small_config(
        tmp_path, base_checkpoint, rollout={"num_rollout": 1}, eval={"eval_interval": None}, ci=gate
    )
    with pytest.raises(Exception, match="no eval ran"):
        asyncio.run(run_flow(no_eval, overwrite=True))
