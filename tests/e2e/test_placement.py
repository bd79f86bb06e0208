"""Placement on a Ray cluster: on a two-node `ray.cluster_utils.Cluster` (custom resources standing for a
trainer machine and a rollout machine), `rollflow run --ray-address` with slime's placement flags puts the actors
where the flags say, as Ray's actor table shows, and the run finishes. Both "machines" are this one: the run dir
is shared by the two nodes, as a multi-node run's must be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from artifacts.store import RunPaths, read_metrics

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _two_node_run(
    tmp_path: Path, prefect_home: Path, base_checkpoint: str, flags: list[str], slots_per_node: int
) -> tuple[dict, dict]:
    """Run tests/two_nodes.py; returns (its report, {actor name: [role of its node, one per incarnation]}) after
    checking that the run finished: both rollouts generated, trained and synced."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")
    }  # the caller's Ray token too
    env.update({"PREFECT_HOME": str(prefect_home), "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "INFO"})
    run_dir = tmp_path / "run"
    common = [
        "--name",
        "two-nodes",
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
        "--eval-interval",
        "none",
    ]
    report_path = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.two_nodes",
            str(report_path),
            "--slots-per-node",
            str(slots_per_node),
            "--",
            *common,
            *flags,
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=1500,
    )
    report = json.loads(report_path.read_text())
    assert report["returncode"] == 0, report["output"]
    records = read_metrics(RunPaths(run_dir).metrics)
    assert sorted({r["rollout_id"] for r in records if r["kind"] == "step"}) == [0, 1]
    assert {r["rollout_id"] for r in records if r["kind"] == "check"} == {0, 1}
    placed = {name: [report["nodes"][node] for node in nodes] for name, nodes in report["actors"].items()}
    print(f"two-node run: {report['seconds']:.1f} s; placement {placed}")
    return report, placed


def test_trainers_on_one_node_engines_on_the_other(tmp_path, prefect_home, base_checkpoint):
    report, placed = _two_node_run(
        tmp_path,
        prefect_home,
        base_checkpoint,
        [
            "--data-parallel-size",
            "2",
            "--actor-num-nodes",
            "1",
            "--actor-num-gpus-per-node",
            "2",
            "--rollout-num-gpus",
            "2",
            "--rollout-num-gpus-per-engine",
            "1",
            "--actor-resources",
            '{"trainer_node": 0.001}',
            "--rollout-resources",
            '{"rollout_node": 0.001}',
        ],
        slots_per_node=2,
    )
    # Ray's actor table: each actor ran once, every trainer rank on the trainer machine, every engine on the other,
    # and the rollout actor beside `rollflow run` (which joined the cluster at its head, the trainer machine)
    assert placed == {
        "trainer-0": ["trainer_node"],
        "trainer-1": ["trainer_node"],
        "engine-0": ["rollout_node"],
        "engine-1": ["rollout_node"],
        "rollout": ["trainer_node"],
    }, placed
    assert "placement: 4 slot(s) of rollflow_slot" in report["output"]
    assert (
        "trainers: 2 rank(s) on 1 node(s), rendezvous in a file store under the run dir" in report["output"]
    )


def test_colocated_ranks_on_two_nodes_meet_over_tcp(tmp_path, prefect_home, base_checkpoint):
    report, placed = _two_node_run(
        tmp_path,
        prefect_home,
        base_checkpoint,
        [
            "--data-parallel-size",
            "2",
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "1",
            "--colocate",
            "--rollout-num-engines",
            "2",
        ],
        slots_per_node=1,
    )
    # one slot per machine: rank r and engine r share the slot of one machine, and the ranks span both machines
    assert placed["trainer-0"] == placed["engine-0"] and placed["trainer-1"] == placed["engine-1"], placed
    assert {placed["trainer-0"][0], placed["trainer-1"][0]} == {"trainer_node", "rollout_node"}, placed
    assert "placement: 2 slot(s) of rollflow_slot (colocated)" in report["output"]
    assert "trainers: 2 rank(s) on 2 node(s), rendezvous at tcp://" in report["output"]
