"""Deployments against a real Prefect server (the test harness): the README's `prefect deploy` steps on a
fresh server, and a served deployment run given a partial `cfg` that deep-merges over the served defaults,
executed by Prefect's engine the way a worker or `serve` executes it."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from artifacts.store import RunPaths, read_metrics
from config import RunConfig
from tests.helpers import wandb_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _prefect(*args: str) -> subprocess.CompletedProcess:
    """`.venv/bin/prefect ARGS` in the repo root, as the README runs it, against the test server."""
    from prefect.settings import PREFECT_API_URL

    script = ROOT / ".venv" / "bin" / "prefect"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "prefect"]
    # PYTHONPATH: the flows prefect.yaml names are loaded from this checkout, whatever the venv's install points at
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(ROOT)}
    return subprocess.run([*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_readme_deploy_steps_work_on_a_fresh_server(prefect_server):
    from prefect.client.orchestration import get_client

    readme = (ROOT / "README.md").read_text()
    steps = [
        ".venv/bin/prefect work-pool create rollflow --type process --overwrite",
        ".venv/bin/prefect deploy --all",
    ]
    for step in steps:
        assert step in readme  # the test runs what the README says
        done = _prefect(*step.split()[1:])
        assert done.returncode == 0, f"{step}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    async def read() -> tuple:
        async with get_client() as client:
            pool = await client.read_work_pool("rollflow")
            run = await client.read_deployment_by_name("rollflow-run/tiny-arith")
            replay = await client.read_deployment_by_name("replay/rollflow")
            return pool, run, replay

    pool, run, replay = asyncio.run(read())
    assert pool.type == "process"
    assert run.work_pool_name == replay.work_pool_name == "rollflow"
    assert run.parameters == {"cfg": {"name": "tiny-arith-scheduled"}}
    assert run.entrypoint == "flows/run.py:run_flow" and replay.entrypoint == "flows/replay.py:replay_flow"
    schema = replay.parameter_openapi_schema
    assert set(schema["required"]) == {"run_dir", "rollout_id", "task"}  # the UI's Run form asks for these
    assert schema["properties"]["task"]["enum"] == ["generate", "log-prob", "train-step", "sync", "check"]


def test_a_worker_runs_the_deployed_run_and_a_replay_of_it_to_completed(
    prefect_server, base_checkpoint, tmp_path
):
    """The README's path end to end: the pool, `prefect deploy --all`, a real `prefect worker start` process, and a
    run of each deployment through the API (as `prefect deployment run` and the UI's Run form do), each flow run in
    the worker's own subprocess, which sets up Ray itself."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    for step in ("work-pool create rollflow --type process --overwrite", "deploy --all"):
        done = _prefect(*step.split())
        assert done.returncode == 0, f"{step}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    script = ROOT / ".venv" / "bin" / "prefect"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "prefect"]
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PYTHONPATH": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
    }
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "GLOO_SOCKET_IFNAME"):  # as a user's shell has them: unset
        env.pop(var, None)
    env["HOME"] = str(tmp_path / "home")  # Ray's own token file goes there, not into the user's home
    name = f"worker-{uuid.uuid4().hex[:6]}"  # its runs' dirs: runs/<name>-<flow run>, under the worker's cwd
    cfg = {
        "name": name,
        "hf_checkpoint": base_checkpoint,
        "rollout": {"num_rollout": 2, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
        "eval": {"eval_interval": None},
        "train": {"global_batch_size": 8},
        "checkpoint": {"save": str(tmp_path / "ckpt"), "save_interval": 1},
    }
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen(
            [*cmd, "worker", "start", "--pool", "rollflow", "--limit", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def run(name: str, parameters: dict) -> str:
                # called outside an event loop, Prefect's run_deployment waits for the flow run's final state
                flow_run = run_deployment(name, parameters=parameters, timeout=600, poll_interval=2)
                return flow_run.state.name  # type: ignore[union-attr]

            def output() -> str:  # the worker streams its flow runs' output
                return (tmp_path / "worker.log").read_text()

            # the same deployment three times in a row, as a schedule runs it: each run in a run dir of its own
            assert run("rollflow-run/tiny-arith", {"cfg": cfg}) == "Completed", output()[-4000:]
            unsaved = {**cfg, "checkpoint": {}}
            for _ in range(2):
                assert run("rollflow-run/tiny-arith", {"cfg": unsaved}) == "Completed", output()[-4000:]
            run_dirs = sorted(ROOT.glob(f"runs/{name}-*"), key=lambda d: d.stat().st_mtime)
            assert len(run_dirs) == 3
            for run_dir in run_dirs:
                records = read_metrics(RunPaths(run_dir).metrics)
                assert {r["rollout_id"] for r in records if r["kind"] == "step"} == {0, 1}
            replay = {"run_dir": str(run_dirs[0]), "rollout_id": 1, "task": "train-step"}
            assert run("replay/rollflow", replay) == "Completed", output()[-4000:]
            assert "replay of train-step for rollout 1: identical" in output()
        finally:
            worker.terminate()
            worker.wait(timeout=60)
            for run_dir in ROOT.glob(f"runs/{name}-*"):
                shutil.rmtree(run_dir, ignore_errors=True)


def test_partial_parameters_merge_over_served_defaults(
    tmp_path, ray_session, prefect_server, base_checkpoint, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow as run_in_engine

    from deployments.serve import deployments
    from flows.run import run_flow

    monkeypatch.chdir(tmp_path)  # tensorboard_log/ lands here
    served = RunConfig.model_validate(
        {
            "name": "served",
            "run_dir": str(tmp_path / "run"),
            "hf_checkpoint": base_checkpoint,
            "rollout": {"num_rollout": 3, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "eval": {"eval_interval": None},
            "train": {"global_batch_size": 8, "lr": 1e-2},
            "logging": {
                "use_tensorboard": True,
                "tb_project_name": "p",
                "tb_experiment_name": "served",
                "use_wandb": True,
                "wandb_mode": "offline",
                "wandb_dir": str(tmp_path / "wb"),
            },
        }
    )
    run_deployment, replay_deployment = deployments(served)

    async def go() -> tuple:
        async with get_client() as client:
            deployment_id = await run_deployment.aapply()
            await replay_deployment.aapply()
            flow_run = await client.create_flow_run_from_deployment(
                deployment_id, parameters={"cfg": {"rollout": {"num_rollout": 1}}}
            )
            assert flow_run.parameters == {
                "cfg": {"rollout": {"num_rollout": 1}}
            }  # Prefect's merge is shallow
            state = await run_in_engine(run_flow, flow_run=flow_run, return_type="state")  # type: ignore[misc]
            return state, await client.read_flow_run(flow_run.id)

    state, flow_run = asyncio.run(go())
    assert state.is_completed(), state.message
    assert flow_run.name == "run/served"

    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert written["name"] == "served" and written["rollout"]["num_rollout"] == 1
    assert written["rollout"]["rollout_batch_size"] == 4 and written["train"]["lr"] == 1e-2  # deep merge
    records = read_metrics(RunPaths(tmp_path / "run").metrics)
    assert {r["rollout_id"] for r in records if r["kind"] == "rollout"} == {0}

    # the end of the run: plot drawn, trackers finished with slime's names
    assert (tmp_path / "run" / "plots" / "curves.png").stat().st_size > 1000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard_log" / "p" / "served"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("rollout/raw_reward")] == [0]
    assert [e.step for e in acc.Scalars("train/grad_norm")] == [0, 1]
    (wandb_file,) = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    kinds = [r.WhichOneof("record_type") for r in wandb_records(wandb_file)]
    assert kinds.count("history") >= 4 and "exit" in kinds
