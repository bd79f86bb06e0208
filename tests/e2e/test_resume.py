"""The driver killed with `kill -9` mid-rollout: nothing of it stays alive, and `rollflow run --resume` finishes
the run identical to an uninterrupted one. Runs `rollflow run` as a user does, in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.diff import first_divergence
from flows.reaper import _descendants, _stat

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _env(prefect_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "PREFECT_API"))}
    return {
        **env,
        "PREFECT_HOME": str(prefect_home),
        "PYTHONPATH": str(ROOT),
        "PREFECT_LOGGING_LEVEL": "INFO",
    }


def _flags(base_checkpoint: str, run_dir: Path) -> list[str]:
    return [
        "--hf-checkpoint",
        base_checkpoint,
        "--run-dir",
        str(run_dir),
        "--num-rollout",
        "4",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "8",
        "--lr",
        "1e-2",
        "--eval-interval",
        "2",
        "--n-samples-per-eval-prompt",
        "1",
        "--save",
        str(run_dir / "ckpt"),
        "--save-interval",
        "1",
    ]


def _rollflow(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


def test_killed_driver_leaves_nothing_and_resume_matches_a_straight_run(
    tmp_path, prefect_home, base_checkpoint, straight_run
):
    env, straight = _env(prefect_home), straight_run
    cut = tmp_path / "cut"
    driver = _rollflow(["--name", "cut", *_flags(base_checkpoint, cut)], env)
    deadline = time.monotonic() + 600
    while not any(r["kind"] == "step" and r["rollout_id"] == 2 for r in _records(cut)):  # inside rollout 2
        assert driver.poll() is None and time.monotonic() < deadline, (
            driver.stdout.read() if driver.stdout else ""
        )
        time.sleep(0.05)
    tree = _descendants(driver.pid)
    assert len(tree) >= 3  # the Prefect server and Ray's processes
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    gone_by = time.monotonic() + 10
    while left := [
        pid
        for pid, start in tree.items()
        if (st := _stat(pid)) is not None and st[1] == start and st[2] != "Z"
    ]:
        assert time.monotonic() < gone_by, f"processes of the killed run still alive after 10 s: {left}"
        time.sleep(0.2)

    resumed = _rollflow(["--resume", str(cut)], env)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming run" in out and "at rollout 2" in out
    assert "Crashed" in out  # the killed run's flow runs, still "Running" on the server, were marked Crashed
    assert first_divergence(straight, cut) is None
    records = _records(cut)
    steps = [(r["rollout_id"], r["step"]) for r in records if r["kind"] == "step"]
    assert steps == sorted(set(steps)) and len(steps) == 8  # no duplicate records of the rollout that was cut
    assert len({r["run_id"] for r in records}) == 1

    # a machine crash left the last rollout's snapshot and --save checkpoint cut short (not yet on the disk):
    # --resume names them and the command that continues from the latest intact state, which runs rollout 3 again
    # to the same end
    (cut / "ft" / "trainer" / "iter_0000003" / "model.safetensors").write_bytes(b"")
    passed = _rollflow(["--resume", str(cut)], env)  # the --save checkpoint of rollout 3 is whole: taken
    out, _ = passed.communicate(timeout=600)
    assert passed.returncode == 0, out[-3000:]
    assert f"iter_0000003 is damaged (model.safetensors is empty): the trainers restore {cut / 'ckpt'}" in out
    (cut / "ckpt" / "iter_0000003" / "meta.json").write_bytes(b'{"rollout_id": 3, "glo')
    refused = _rollflow(["--resume", str(cut)], env)
    out, _ = refused.communicate(timeout=600)
    assert refused.returncode != 0
    assert "iter_0000003 is damaged (model.safetensors is empty)" in out
    assert "iter_0000003 is damaged (meta.json is not JSON)" in out
    command = out.split("`rollflow run ", 1)[1].split("`", 1)[0].split()
    assert command == [
        "--config",
        str(cut / "config.yaml"),
        "--run-dir",
        str(cut),
        "--load",
        str(cut / "ft" / "trainer" / "iter_0000002"),
    ]
    again = _rollflow(command, env)
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out[-3000:]
    assert first_divergence(straight, cut) is None
    assert [r["rollout_id"] for r in _records(cut) if r["kind"] == "step"] == [0, 0, 1, 1, 2, 2, 3, 3]
