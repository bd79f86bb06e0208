"""Faults injected at rollflow's named hooks are survived, bitwise, or fail naming the hook, action and rollout."""

from __future__ import annotations

import asyncio
import json

import pytest

from flows.diff import first_divergence
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e

FAST = {
    "task_retry_delay": 0.0,
    "rollout_timeout": 60.0,
    "train_timeout": 60.0,
    "update_weights_timeout": 60.0,
}


def faulted_config(tmp_path, base_checkpoint, name: str, hooks: list[dict] | None, rollouts: int = 3):
    return small_config(
        tmp_path / name,
        base_checkpoint,
        rollout={"num_rollout": rollouts},
        eval={"eval_interval": None},
        checkpoint={"save": str(tmp_path / name / "ckpt"), "save_interval": 1, "ci_save_model_hash": True},
        faults={**FAST, "ci_fault_hooks": json.dumps(hooks) if hooks else None},
    )


def fault_log(cfg) -> list[dict]:
    return [json.loads(line) for line in (cfg.resolved_run_dir / "faults.jsonl").read_text().splitlines()]


def test_a_killed_engine_trainer_and_rollout_actor_are_survived_bitwise(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from flows.run import run_flow

    clean = faulted_config(tmp_path, base_checkpoint, "clean", None)
    asyncio.run(run_flow(clean))
    hooks = [
        {
            "request_id": "kill-engine",
            "hook_name": "engine_generate_start",
            "action": {"kind": "kill_process"},
            "rollout_id": 1,
        },
        {
            "request_id": "kill-trainer",
            "hook_name": "trainer_step_before_allreduce",
            "action": {"kind": "kill_process"},
            "rollout_id": 2,
        },
        {  # rollout 2's generation is the parent's head start: the chained log-prob pass fails with it
            "request_id": "kill-rollout",
            "hook_name": "rollout_finish_start",
            "action": {"kind": "kill_process"},
            "rollout_id": 2,
        },
        {  # after rollout 0's step, before its snapshot (the sync writes it): the retried sync applies it again
            "request_id": "kill-trainer-export",
            "hook_name": "trainer_export_weights_before_send",
            "action": {"kind": "kill_process"},
            "rollout_id": 0,
        },
    ]
    faulted = faulted_config(tmp_path, base_checkpoint, "faulted", hooks)
    asyncio.run(run_flow(faulted))
    fired = {e["request_id"]: e for e in fault_log(faulted) if e["status"] == "fired"}
    assert (
        fired["kill-engine"]["process"] == "engine-0" and fired["kill-engine"]["context"]["rollout_id"] == 1
    )
    assert (
        fired["kill-trainer"]["process"] == "trainer-0"
        and fired["kill-trainer"]["context"]["rollout_id"] == 2
    )
    assert (
        fired["kill-rollout"]["process"] == "rollout" and fired["kill-rollout"]["context"]["rollout_id"] == 2
    )
    assert fired["kill-trainer-export"]["process"] == "trainer-0"
    log = (faulted.resolved_run_dir / "logs" / "run.log").read_text()
    assert (
        "sync 0: the trainers were restored to rollout -1" in log and "applying rollout 0's step again" in log
    )
    # every sample, every metric and the per-layer hashes of every checkpoint as in the fault-free run
    assert first_divergence(clean.resolved_run_dir, faulted.resolved_run_dir) is None


def test_a_fault_that_is_not_survived_names_hook_action_and_rollout(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from flows.run import run_flow

    hooks = [
        {
            "request_id": "boom",
            "hook_name": "engine_generate_start",
            "action": {"kind": "raise", "message": "injected"},
            "rollout_id": 0,
            "attempt": 0,
        }
    ]
    cfg = faulted_config(tmp_path, base_checkpoint, "raise", hooks, rollouts=1)
    cfg = cfg.model_copy(update={"faults": cfg.faults.model_copy(update={"task_retries": 0})})
    with pytest.raises(
        Exception, match=r"fault hook boom: raise at engine_generate_start in engine-0 .*rollout_id 0"
    ):
        asyncio.run(run_flow(cfg))
