"""End to end: real Prefect flows over real Ray actors on the tiny model."""

from __future__ import annotations

import asyncio
import math
import os

import pytest
import torch
from safetensors.torch import load_file

import procs
from artifacts.schema import SAMPLE_SCHEMA
from artifacts.store import RunPaths, read_metrics, read_rollout, read_table
from config import RunConfig

pytestmark = pytest.mark.e2e


def small_config(tmp_path, base_checkpoint, **sections) -> RunConfig:
    data = {
        "name": "e2e",
        "run_dir": str(tmp_path / "run"),
        "hf_checkpoint": base_checkpoint,
        "rollout": {"num_rollout": 2, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
        "eval": {"eval_interval": 1, "n_samples_per_eval_prompt": 1},
        "train": {"global_batch_size": 8, "lr": 1e-2},
        "checkpoint": {"save": str(tmp_path / "ckpt"), "save_interval": 1},
    }
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return RunConfig.model_validate(data)


async def _task_states(client, flow_run_ids) -> dict[str, list[str]]:
    """{task name (without Prefect's run suffix): sorted state names} over the given flow runs."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids)))
    out: dict[str, list[str]] = {}
    for r in runs:
        out.setdefault(r.name.rsplit("-", 1)[0], []).append(r.state.name)
    return {k: sorted(v) for k, v in out.items()}


async def _metric_tables(client, flow_runs) -> dict[str, tuple[str, list[dict]]]:
    """{flow run name: (key, rows)} of the one table artifact attached to each flow run."""
    import json

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    out = {}
    for run in flow_runs:
        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]), type=ArtifactFilterType(any_=["table"])
            )
        )
        assert len(arts) == 1, f"{run.name}: {len(arts)} table artifacts"
        data = arts[0].data
        out[run.name] = (arts[0].key, json.loads(data) if isinstance(data, str) else data)
    return out


def test_run_learns_writes_artifacts_and_caches(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.run import run_flow

    cfg = small_config(tmp_path, base_checkpoint, placement={"orchestrator_niceness": 5})
    result = asyncio.run(run_flow(cfg))
    paths = RunPaths(cfg.resolved_run_dir)

    # once the actors were up, this process (the run's orchestrator) and the Prefect server it started yielded
    # the CPU to them (--orchestrator-niceness 5); the actors, started by Ray before, kept their priority
    from flows.prefect_private import temporary_server_pids

    servers = temporary_server_pids()
    assert servers and {os.getpid(), *servers} <= procs._LOWERED
    assert os.getpriority(os.PRIO_PROCESS, 0) >= 5

    # weights moved: the saved model differs from the base checkpoint
    base = load_file(f"{base_checkpoint}/model.safetensors")
    trained = load_file(str(tmp_path / "ckpt" / "iter_0000001" / "model.safetensors"))
    assert any(not torch.equal(base[k], trained[k]) for k in base)

    # rollouts reload with the schema, and their content is what the loop produced
    for rid in range(2):
        samples = read_rollout(paths.rollout(rid))
        assert len(samples) == 16 and {s.rollout_id for s in samples} == {rid}
        assert read_table(paths.rollout(rid)).schema.equals(SAMPLE_SCHEMA, check_metadata=False)
        assert all(len(s.rollout_log_probs) == s.response_length for s in samples)
        lp = read_table(paths.logprobs(rid)).to_pylist()
        assert len(lp) == 16
    assert paths.eval_rollout(0).exists() and paths.eval_rollout(2).exists()

    # metrics are finite and use slime's names
    records = read_metrics(paths.metrics)
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 4  # 2 rollouts x (16 samples / gbs 8)
    for r in steps:
        assert {"train/loss", "train/pg_loss", "train/ppo_kl", "train/pg_clipfrac", "train/grad_norm"} <= set(
            r["metrics"]
        )
        assert all(math.isfinite(v) for v in r["metrics"].values())
    assert steps[0]["metrics"]["train/ppo_kl"] == 0.0  # first step: new == old log-probs bitwise
    kinds = {r["kind"] for r in records}
    assert {"rollout", "perf", "step", "check", "eval"} <= kinds
    assert set(result["evals"]) == {0, 1, 2}
    # every process of the run reported its memory at the end of each rollout
    for rid in range(2):
        memory = {
            k: v
            for r in records
            if r["kind"] == "perf" and r["rollout_id"] == rid
            for k, v in r["metrics"].items()
        }
        for process in ("driver", "rollout", "engine-0", "trainer-0"):
            assert 0 < memory[f"perf/mem_rss_gb/{process}"] <= memory[f"perf/mem_peak_gb/{process}"]

    # a second run into the same run dir is refused unless it resumes the run or replaces it; with --overwrite it
    # computes every stage itself (caches are scoped to a run) and, being deterministic, lands on the same weights,
    # also with --offload-rollout (the engines drop their weights while the trainer works and get them back)
    with pytest.raises(ValueError, match="holds the records of run .* --resume .* --overwrite"):
        asyncio.run(run_flow(cfg))
    offloaded = cfg.model_copy(
        update={"placement": cfg.placement.model_copy(update={"offload_rollout": True})}
    )
    result2 = asyncio.run(run_flow(offloaded, overwrite=True))
    assert result2["evals"] == result["evals"]
    trained2 = load_file(str(tmp_path / "ckpt" / "iter_0000001" / "model.safetensors"))
    assert all(torch.equal(trained[k], trained2[k]) for k in trained)
    from prefect.client.orchestration import get_client

    async def states():
        async with get_client() as client:
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
            from prefect.client.schemas.sorting import FlowRunSort

            # the newest two rollout runs, chosen by the server: the session's server holds every e2e test's
            # runs, more than one unfiltered page
            latest = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="rollout-")),
                sort=FlowRunSort.START_TIME_DESC,
                limit=2,
            )
            assert sorted(r.name for r in latest) == ["rollout-0", "rollout-1"]
            return (
                await _task_states(client, [r.id for r in latest]),
                await _metric_tables(client, latest),
                {r.name: r.id for r in latest},
            )

    got, tables, ids = asyncio.run(states())
    # each rollout-<id> flow run carries its metrics table artifact (the parent attaches it)
    for name, (key, rows) in tables.items():
        assert key == f"e2e-{name}-metrics"
        assert {"train/loss", "rollout/raw_reward", "check/engines_in_sync"} <= {r["metric"] for r in rows}
    assert got["generate"] == ["Completed", "Completed"] and got["log-prob"] == ["Completed", "Completed"]
    assert {"generate", "save-rollout", "log-prob", "train-step", "sync", "check", "eval"} <= set(got)

    # the parent waits for as many recorded task runs as the child started (six stages + evals), not
    # just for those already recorded: rollout-0 ran eval 0 and eval 1, rollout-1 eval 2
    from flows.runtime import settle as _settle

    assert asyncio.run(_settle(8, flow_run_id=ids["rollout-0"])) and asyncio.run(
        _settle(7, flow_run_id=ids["rollout-1"])
    )
    assert not asyncio.run(_settle(9, flow_run_id=ids["rollout-0"], timeout=0.3))


def test_two_data_parallel_ranks_train_in_one_gloo_group(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from flows.run import run_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        train={"data_parallel_size": 2},
    )
    asyncio.run(run_flow(cfg))
    steps = [r for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(v) for r in steps for v in r["metrics"].values())
    base = load_file(f"{base_checkpoint}/model.safetensors")
    trained = load_file(str(tmp_path / "ckpt" / "iter_0000000" / "model.safetensors"))
    assert any(not torch.equal(base[k], trained[k]) for k in base)
