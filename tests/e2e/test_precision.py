"""A --precision bf16 run through Prefect and Ray: every --ci-test checker passes (the weight-update check bitwise on
the engines' bfloat16 weights, the engines-in-sync check, the re-execution checks, the log-prob checker at its bf16
bound), config.yaml and the rollout files record bf16, and replays of the sync and of the train step compare like
with like. Runs on a CPU without bf16 too (emulated, slower)."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from artifacts.store import RunPaths, read_metadata, read_metrics
from flows.doctor import diagnose
from tests.e2e.test_ci_checks import ci_flags
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def test_a_bf16_run_passes_every_checker_and_replays(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.replay import replay_flow
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        train={"precision": "bf16", "lr": 2e-4},
        eval={"eval_interval": None},
        ci=ci_flags(base_checkpoint),
    )
    asyncio.run(run_flow(cfg))
    run_dir = cfg.resolved_run_dir
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["precision"] == "bf16"
    assert read_metadata(RunPaths(run_dir).rollout(0))["precision"] == "bf16"
    checks = [r["metrics"] for r in read_metrics(RunPaths(run_dir).metrics) if r["kind"] == "check"]
    assert {"check/weight_update_equal": 1.0} in checks
    assert not [c for c in checks if "check/violations" in c]
    passed = {k for c in checks for k, v in c.items() if v == 1.0}
    assert {
        "check/engines_in_sync",
        "check/log_prob_deterministic",
        "check/train_step_deterministic",
        "check/generate_deterministic",
    } <= passed
    assert not [f for f in diagnose(run_dir) if f.severity != "info"]
    # sync: the checkpoint's float32 weights against the bf16 engine's; train-step: the autocast step again, its
    # float32 master weights against the checkpoint's
    for task in ("sync", "train-step"):
        result = asyncio.run(replay_flow(str(run_dir), 1, task))
        assert result["identical"], (task, result["difference"])
