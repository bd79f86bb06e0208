"""End to end with `--train-backend megatron`: the real flow, tensor parallel 2, every --ci-test checker."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file

from artifacts.store import RunPaths, read_metrics
from tests.e2e.test_ci_checks import ci_flags
from tests.e2e.test_loop import small_config

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e


def test_megatron_tp2_run_passes_every_checker_and_saves_both_formats(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        train={"train_backend": "megatron", "tensor_model_parallel_size": 2},
        checkpoint={"ci_save_model_hash": True},
        ci={**ci_flags(base_checkpoint), "check_weight_update_equal": True},
    )
    assert cfg.trainer_world_size == 2
    asyncio.run(run_flow(cfg))

    records = read_metrics(RunPaths(cfg.resolved_run_dir).metrics)
    checks = [r["metrics"] for r in records if r["kind"] == "check"]
    assert {"check/weight_update_equal": 1.0} in checks and not [c for c in checks if "check/violations" in c]
    assert (
        sum(1 for c in checks if c.get("check/engines_in_sync") == 1.0) == 2
    )  # engines hold the exported weights
    steps = [r["metrics"] for r in records if r["kind"] == "step"]
    assert len(steps) == 4 and steps[0]["train/ppo_kl"] == 0.0

    saved = tmp_path / "ckpt" / "iter_0000001"
    assert json.loads((saved / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (saved / "model_hash_tp0_pp0_dp0_cp0.json").is_file() and (
        saved / "model_hash_tp1_pp0_dp0_cp0.json"
    ).is_file()
    base, trained = (
        load_file(f"{base_checkpoint}/model.safetensors"),
        load_file(str(saved / "model.safetensors")),
    )
    assert any(not torch.equal(base[k], trained[k]) for k in base)  # the HF export moved with training
