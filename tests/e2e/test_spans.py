"""End to end: the Prefect timeline tells the truth. Each actor call a stage stands for runs inside a task run
of that stage (flows/spans.py): no head start before a task run starts, no work left running after it ends."""

from __future__ import annotations

import asyncio

import pytest

from config import RunConfig

pytestmark = pytest.mark.e2e


def test_every_stage_call_runs_inside_its_task_run(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.run import run_flow
    from flows.spans import measure

    cfg = RunConfig.model_validate(
        {
            "name": "e2e-spans",
            "run_dir": str(tmp_path / "run"),
            "hf_checkpoint": base_checkpoint,
            "num_threads": 1,
            "rollout": {"num_rollout": 3, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
            # evals 0 (before rollout 0), 2 (after rollout 1) and 3 (after the last)
            "eval": {"eval_interval": 2, "n_samples_per_eval_prompt": 1},
            "train": {"global_batch_size": 8},
            # the parent's own task runs: a save after rollout 1 and after the last
            "checkpoint": {"save": str(tmp_path / "ckpt"), "save_interval": 2},
        }
    )
    state = asyncio.run(run_flow(cfg, return_state=True))
    assert state.is_completed(), state.message
    report = asyncio.run(measure(state.state_details.flow_run_id, tolerance_ms=5.0))

    table = report.table()
    violations = report.violations
    assert violations == 0, f"actor calls outside their stages' task runs:\n{table}"
    # not vacuous: each stage's calls were found in the timeline and attributed to it
    for stage in ("generate", "eval", "log-prob", "train-step", "sync", "check", "save"):
        assert report.stages[stage].calls >= 1, f"no {stage} call in the timeline:\n{table}"
