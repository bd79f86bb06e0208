"""End to end: cutting the loop (rollout-only / train-only), recordings in both formats, injection,
forge replay and task-level replay, on real flows over real actors."""

from __future__ import annotations

import asyncio
import json

import pytest

from artifacts.slime_format import read_any
from artifacts.store import RunPaths, read_metrics, read_rollout
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def _records(cfg, kind):
    return [r for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == kind]


def _stage_end_raise(stage: str, rollout_id: int) -> dict:
    """A run's faults: `stage`'s task raises once at its end (after its work and files) in rollout `rollout_id`."""
    from config.stages import stage_end_hook

    request = {"request_id": f"end-{stage}", "hook_name": stage_end_hook(stage), "action": {"kind": "raise"}}
    hooks = [{**request, "rollout_id": rollout_id, "attempt": 0}]
    return {"task_retry_delay": 0.0, "ci_fault_hooks": json.dumps(hooks)}


def _fired(cfg) -> list[str]:
    lines = (cfg.resolved_run_dir / "faults.jsonl").read_text().splitlines()
    return [e["request_id"] for e in map(json.loads, lines) if e["status"] == "fired"]


def _forbid(monkeypatch, name):
    from tasks import actors

    async def refuse(*args, **kwargs):
        raise AssertionError(f"{name} must not be called in this mode")

    monkeypatch.setattr(actors, name, refuse)


def test_record_rollout_only_then_train_only_from_slime_pt(
    tmp_path, ray_session, prefect_server, base_checkpoint, monkeypatch
):
    from flows.run import run_flow

    template = str(tmp_path / "rec" / "rollout_{rollout_id}.pt")
    record = small_config(
        tmp_path / "a",
        base_checkpoint,
        rollout={"num_rollout": 3},
        eval={"eval_interval": None},
        debug={"debug_rollout_only": True, "save_debug_rollout_data": template},
        checkpoint={},
    )
    with monkeypatch.context() as m:
        _forbid(m, "start_trainers")  # no trainer actor, not even a placeholder
        asyncio.run(run_flow(record))
    assert len(_records(record, "rollout")) == 3 and not _records(record, "step")
    recorded = [read_any(template.format(rollout_id=i)) for i in range(3)]
    assert [s.response_tokens for s in recorded[1]] == [
        s.response_tokens for s in read_rollout(RunPaths(record.resolved_run_dir).rollout(1))
    ]

    train = small_config(
        tmp_path / "b",
        base_checkpoint,
        rollout={"num_rollout": 3},
        eval={"eval_interval": None},
        train={"global_batch_size": 8},
        debug={
            "load_debug_rollout_data": template,
            "load_debug_rollout_data_subsample": 0.5,
            "dump_details": str(tmp_path / "dump"),
        },
        checkpoint={},
        faults=_stage_end_raise(
            "load-rollout", 1
        ),  # retried: the loaded recording is written again, the same
    )
    with monkeypatch.context() as m:
        _forbid(m, "start_engines")  # no engine process during training from recordings
        asyncio.run(run_flow(train))
    assert _fired(train) == ["end-load-rollout"]
    assert len(_records(train, "step")) == 3  # subsample 0.5 keeps 8 of 16 samples: one step of 8 per rollout
    assert not [
        r for r in _records(train, "rollout") if "rollout/raw_reward" in r["metrics"]
    ]  # loaded: no rollout metrics
    from artifacts.store import read_table

    dumped = read_table(tmp_path / "dump" / "train_data" / "2_0.parquet").to_pylist()
    kept = read_rollout(RunPaths(train.resolved_run_dir).rollout(2))
    assert sorted(r["sample_index"] for r in dumped) == sorted(s.sample_index for s in kept)  # joins by index
    assert [s.sample_index for s in kept] == [0, 1, 2, 3, 12, 13, 14, 15]  # head + tail
    assert (tmp_path / "dump" / "rollout_data" / "2.parquet").exists()


def test_replay_of_train_step_and_generate_is_bitwise(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.replay import replay_flow
    from flows.run import run_flow

    cfg = small_config(tmp_path, base_checkpoint, eval={"eval_interval": None})
    asyncio.run(run_flow(cfg))
    run_dir = str(cfg.resolved_run_dir)
    for task in ("train-step", "generate", "log-prob"):
        result = asyncio.run(replay_flow(run_dir, 1, task))
        assert result["identical"], (task, result["difference"])
    changed = asyncio.run(replay_flow(run_dir, 1, "train-step", {"train.entropy_coef": 0.01}))
    assert not changed["identical"] and "metric" in changed["difference"]


def test_injection_passes_on_a_healthy_run_and_names_the_ratio_when_weights_are_stale(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from flows.run import run_flow

    template = str(tmp_path / "rec" / "rollout_{rollout_id}.parquet")
    source = small_config(
        tmp_path / "src",
        base_checkpoint,
        eval={"eval_interval": None},
        rollout={"num_rollout": 3},
        debug={"save_debug_rollout_data": template},
    )
    asyncio.run(run_flow(source))
    inject = {"ci_inject_rollout_data_path": template, "ci_inject_rollout_data_start_rollout_id": 1}
    healthy = small_config(
        tmp_path / "ok",
        base_checkpoint,
        eval={"eval_interval": None},
        rollout={"num_rollout": 3},
        debug=inject,
        faults=_stage_end_raise("inject", 1),  # retried: the guard runs again and passes again
    )
    asyncio.run(run_flow(healthy))
    assert _fired(healthy) == ["end-inject"]
    ratios = [
        r["metrics"]["check/inject_mean_match_ratio"]
        for r in _records(healthy, "check")
        if "check/inject_mean_match_ratio" in r["metrics"]
    ]
    assert len(ratios) == 2 and min(ratios) > 0.9

    stale = small_config(
        tmp_path / "stale",
        base_checkpoint,
        eval={"eval_interval": None},
        rollout={"num_rollout": 3},
        debug={**inject, "debug_skip_weight_update": True},
    )
    with pytest.raises(Exception, match=r"(?s)on average.*threshold 0\.9.*wrong weights"):
        asyncio.run(run_flow(stale))
    # the doctor names the guard from what the run recorded (outcome.json): a failure that leaves no check record
    from flows.doctor import diagnose

    first = diagnose(stale.resolved_run_dir)[0]
    assert (first.severity, first.rule) == ("error", "inject-guard")
    assert first.title.startswith("the inject match guard stopped the run at rollout 1, stage inject: ")


def test_forge_replay_keeps_engines_syncing(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.run import run_flow

    template = str(tmp_path / "rec" / "rollout_{rollout_id}.parquet")
    source = small_config(
        tmp_path / "src",
        base_checkpoint,
        eval={"eval_interval": None},
        rollout={"num_rollout": 1},
        debug={"save_debug_rollout_data": template},
        checkpoint={},
    )
    asyncio.run(run_flow(source))
    forge = small_config(
        tmp_path / "forge",
        base_checkpoint,
        eval={"eval_interval": None},
        rollout={"num_rollout": 2},
        debug={"load_forge_rollout_data": template},
        checkpoint={},
    )
    asyncio.run(run_flow(forge))  # rollout 1 has no recording: falls back to rollout 0's
    versions = [r["metrics"]["check/weight_version"] for r in _records(forge, "check")]
    assert versions == [1, 2]  # weights kept syncing to the live engines
    assert len(_records(forge, "step")) == 4
