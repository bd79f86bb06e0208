"""Faults injected at rollflow's named hooks are survived, bitwise, or fail naming the hook, action and rollout."""

from __future__ import annotations

import asyncio
import json

import pytest

from artifacts.store import RunPaths, read_table
from config.stages import stage_end_hook
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
        {
            "request_id": "kill-rollout",
            "hook_name": "rollout_finish_start",
            "action": {"kind": "kill_process"},
            "rollout_id": 2,
        },
        {  # after rollout 0's step and its snapshot: the trainers come back at rollout 0 for the retried sync
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
    # every sample, every metric and the per-layer hashes of every checkpoint as in the fault-free run
    assert first_divergence(clean.resolved_run_dir, faulted.resolved_run_dir) is None


# stage -> the rollout (or eval) whose task raises once at its end, after its actor work and files
STAGE_ENDS = {
    "generate": 0,
    "save-rollout": 1,
    "log-prob": 2,
    "train-step": 0,
    "sync": 1,
    "check": 2,
    "eval": 1,
}


def test_a_failure_at_the_end_of_every_stage_is_retried_into_the_same_run(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """Each stage's task raises once after its actors did their work: Prefect retries it, its actors check the
    state the retry depends on, and the run ends identical to a fault-free one, every log-prob table the one its
    step trained on (the fault-free run's)."""
    from flows.run import run_flow

    def config(name: str, hooks: list[dict] | None):
        return small_config(
            tmp_path / name,
            base_checkpoint,
            rollout={"num_rollout": 3},
            checkpoint={"save": str(tmp_path / name / "ckpt"), "save_interval": 1},
            faults={**FAST, "ci_fault_hooks": json.dumps(hooks) if hooks else None},
        )

    clean = config("clean", None)
    asyncio.run(run_flow(clean))
    hooks = [
        {
            "request_id": f"end-{stage}",
            "hook_name": stage_end_hook(stage),
            "action": {"kind": "raise"},
            "rollout_id": rollout_id,
            "attempt": 0,
        }
        for stage, rollout_id in STAGE_ENDS.items()
    ]
    faulted = config("faulted", hooks)
    asyncio.run(run_flow(faulted))
    fired = {e["request_id"]: e for e in fault_log(faulted) if e["status"] == "fired"}
    assert sorted(fired) == sorted(f"end-{stage}" for stage in STAGE_ENDS)
    assert all(e["process"] == "orchestrator" for e in fired.values())
    assert first_divergence(clean.resolved_run_dir, faulted.resolved_run_dir) is None
    for rollout_id in range(3):
        tables = [read_table(RunPaths(c.resolved_run_dir).logprobs(rollout_id)) for c in (clean, faulted)]
        assert tables[0].equals(tables[1])


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
    # the doctor names the fault from what the run recorded (outcome.json, faults.jsonl)
    from flows.doctor import diagnose

    first = diagnose(cfg.resolved_run_dir)[0]
    assert (first.severity, first.rule) == ("error", "fault")
    assert first.title.startswith(
        "an injected fault failed the run at rollout 0, stage generate: fault hook boom: raise at "
        "engine_generate_start in engine-0 "
    )
