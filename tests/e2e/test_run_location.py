"""A finished run copied (and its copy tampered with, checksum kept) and moved: `rollflow replay` and `rollflow run
--resume` work on the dir they are given, and the original's files stay byte for byte, mtimes too. Runs
`rollflow` as a user does, in subprocesses."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from artifacts.store import read_metadata, read_table, write_table
from config import load_yaml
from tests.e2e.test_resume import ROOT, _env

pytestmark = pytest.mark.e2e


def _rollflow(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )


def _files(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: sha256 of its bytes and its mtime (ns)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _tamper_rewards(path: Path) -> None:
    """Every reward of a rollout recording plus 1, written back with a valid checksum (as a hand edit would)."""
    table = read_table(path)
    rewards = pa.array(
        [r + 1.0 for r in table.column("reward").to_pylist()], table.schema.field("reward").type
    )
    reserved = ("schema_version", "kind", "content_sha256")
    meta = {k: v for k, v in read_metadata(path).items() if k not in reserved}
    write_table(
        path,
        table.set_column(table.schema.get_field_index("reward"), "reward", rewards),
        kind="rollout",
        metadata=meta,
    )
    read_table(path)  # still reads: the content checksum matches the edited rewards


def test_replay_and_resume_of_a_copy_touch_only_the_copy(tmp_path, prefect_home, base_checkpoint):
    env = _env(prefect_home)
    orig = tmp_path / "orig"
    flags = ["--name", "orig", "--run-dir", str(orig), "--hf-checkpoint", base_checkpoint]
    flags += ["--save-debug-rollout-data", str(orig / "rec" / "rollout_{rollout_id}.parquet")]
    shape = [
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
    ]
    done = _rollflow(["run", *flags, *shape, "--eval-interval", "none"], env)
    assert done.returncode == 0, done.stdout[-3000:]
    before = _files(orig)

    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    _tamper_rewards(copy / "rollouts" / "rollout_000000.parquet")
    replay = _rollflow(["replay", str(copy), "--rollout-id", "0", "--task", "generate"], env)
    assert replay.returncode == 1, replay.stdout[-3000:]
    lines = replay.stdout.splitlines()  # the copy's edited rewards, not the original's files
    assert "identical" not in lines, replay.stdout[-3000:]
    assert "first difference: column 'reward', sample_index 0" in "\n".join(lines), replay.stdout[-3000:]
    assert any((copy / "replays").iterdir())
    assert _files(copy / "rec") == _files(orig / "rec")  # a replay records nothing outside its replays/ dir

    resumed = _rollflow(["run", "--resume", str(copy)], env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert load_yaml(copy / "config.yaml")["run_dir"] == str(copy)  # the copy now records where it is
    assert (
        json.loads((copy / "run.json").read_text())["flow_run_id"]
        != json.loads((orig / "run.json").read_text())["flow_run_id"]
    )
    assert _files(orig) == before  # nothing of the original was written, read-modified or added to

    moved = tmp_path / "moved"
    copy.rename(moved)
    diff = _rollflow(["diff", str(orig), str(moved)], env)
    assert diff.returncode == 1 and "rollout 0 samples" in diff.stdout and "reward" in diff.stdout, (
        diff.stdout
    )
    assert _files(orig) == before
