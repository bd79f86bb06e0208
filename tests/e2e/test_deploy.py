"""Deployments against real Prefect servers, each way a Prefect user goes in.

The deployment commands of docs/how-to/deployments.md run as written, in order, from a checkout of their own
(`rollflow server`, the work pool, `prefect deploy --all`, a real `prefect worker start`, a run and a replay of it
through `prefect deployment run --watch`); beside them, on the same server, `rollflow serve --interval` whose
schedule runs three times in a row and a replay of each kind, and a worker's run that fails after a rollout and is
retried as the UI's Retry does it. The server and the worker are shared by the module's tests. On the test
session's server: `rollflow serve` refusing a work pool's deployment of its name, and a served deployment run given
a partial `cfg` that deep-merges over the served defaults, executed by Prefect's engine the way a worker or `serve`
executes it."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from artifacts.store import RunPaths, read_metrics
from config import RunConfig
from tests.helpers import wandb_records

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_PAGE = ROOT / "docs" / "how-to" / "deployments.md"  # the page whose commands this test runs
README_PORT = "127.0.0.1:4200"  # the page's server address; the test's server takes a free port instead
# what a checkout leaves out: run outputs and caches (a fresh clone has none of them)
NOT_CHECKED_OUT = {".git", "runs", "wandb", "tensorboard_log", "build"}


def readme_deploy_commands() -> list[str]:
    """The documented deployment commands in the order written: the bash block of docs/how-to/deployments.md that
    deploys prefect.yaml, one command a line (a trailing backslash continues one), comments left as written."""
    page = DEPLOY_PAGE.read_text()
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "prefect deploy --all" in b]
    return [line for line in block.replace("\\\n", " ").splitlines() if shlex.split(line, comments=True)]


def _free_port_pair() -> int:
    """A port free on 127.0.0.1 whose next one is free too (`rollflow server` serves the run files on it)."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return int(port)
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _checkout(dest: Path) -> Path:
    """A checkout of this working tree at `dest`, as a fresh clone has it: its files (linked, so the code under
    test is this tree's) and the venv, without runs or caches."""
    # The venv is shared: set it up from here, so the copy's scripts/setup finds it current and never reinstalls
    # the package from `dest` (its entry points would then name `dest`, deleted after the test).
    subprocess.run([str(ROOT / "scripts" / "setup")], check=True)
    dest.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in NOT_CHECKED_OUT or (entry.name.startswith(".") and entry.name != ".venv"):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started in a session of its own, and what it started in that session. A Prefect worker
    turns a first SIGTERM into a graceful shutdown that can wait on its event loop for minutes; Prefect's CLI
    kills it at a second one."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGTERM, 10), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


@dataclass
class Deployed:
    """The README's server and worker, up, with prefect.yaml deployed; the rest of its commands not run yet."""

    checkout: Path
    port: int  # the server's, for the README's 4200
    env: dict[str, str]
    logs: Path
    rest: list[str]  # the README's commands after the worker's
    server: subprocess.Popen | None = None  # the first command run in the background
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def api(self) -> contextlib.AbstractContextManager[Any]:
        """This process's Prefect client talks to this server inside it."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings({PREFECT_API_URL: self.api_url})

    def run(self, line: str, *, timeout: float = 900) -> subprocess.CompletedProcess | subprocess.Popen:
        """One README command, run as a shell would run it from the checkout: `export` sets the environment of the
        next ones, a trailing `&` runs it in the background (its output into logs/), any other waits for it."""
        argv = shlex.split(line, comments=True)
        if argv[0] == "export":
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                self.env[name] = value.replace(README_PORT, f"127.0.0.1:{self.port}")
            return subprocess.CompletedProcess(argv, 0, "", "")
        background = argv[-1] == "&"
        argv = argv[:-1] if background else argv
        if argv[:2] == ["scripts/rollflow", "server"]:
            argv += ["--port", str(self.port)]
        if not background:
            return subprocess.run(
                argv, cwd=self.checkout, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        log = open(self.logs / f"{Path(argv[0]).name}-{argv[1]}.log", "w")  # noqa: SIM115 (the process keeps it)
        proc = subprocess.Popen(
            argv,
            cwd=self.checkout,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def output(self, name: str) -> str:
        """What a background command (`prefect`, `rollflow`) printed so far."""
        return "".join(p.read_text() for p in sorted(self.logs.glob(f"{name}-*.log")))


@pytest.fixture(scope="module")
def deployed(prefect_server, base_checkpoint, tmp_path_factory) -> Iterator[Deployed]:
    """The README's deployment commands up to the worker's, run in order from a checkout of their own, against a
    server on a free port whose Prefect home starts as a fresh server's (migrated, empty). As a user's shell has
    it: no Ray variables of the test session, PWD the checkout (prefect.yaml's pull step reads it), and a home of
    its own (Ray's token file goes there)."""
    from tests.conftest import _MIGRATED_DB

    base = tmp_path_factory.mktemp("deploy")
    home = base / "prefect"
    home.mkdir()
    shutil.copyfile(_MIGRATED_DB, home / "prefect.db")
    (base / "home").mkdir()
    (base / "logs").mkdir()
    session_only = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "GLOO_SOCKET_IFNAME", "PREFECT_LOGGING_LEVEL")
    env = {k: v for k, v in os.environ.items() if k not in session_only}
    checkout = _checkout(base / "rollflow")
    env.update(
        PREFECT_HOME=str(home), HOME=str(base / "home"), PWD=str(checkout), PREFECT_WORKER_QUERY_SECONDS="1"
    )
    commands = readme_deploy_commands()
    (server_at,) = [i for i, c in enumerate(commands) if c.startswith("scripts/rollflow server")]
    (worker_at,) = [i for i, c in enumerate(commands) if " worker start " in c]
    assert server_at < worker_at
    it = Deployed(checkout, _free_port_pair(), env, base / "logs", commands[worker_at + 1 :])
    try:
        for line in commands[: worker_at + 1]:
            done = it.run(line)
            if isinstance(done, subprocess.Popen):
                assert done.poll() is None, f"{line}: exited {done.returncode}"
                it.server = it.server or done
            else:
                assert done.returncode == 0, f"{line}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert it.env.get("PREFECT_API_URL") == it.api_url  # the README's export, on the test's port
        yield it
    finally:
        for proc in reversed(it.procs):  # the worker, then the server
            _stop(proc)


def _flow_run(deployment: str, parameters: dict, *, timeout: float = 900) -> Any:
    """A run of `deployment` created through the API (as the UI's Run form and `prefect deployment run` do), after
    it reached a final state."""
    from prefect.deployments import run_deployment

    # called outside an event loop, Prefect's run_deployment waits for the flow run's final state
    return run_deployment(deployment, parameters=parameters, timeout=timeout, poll_interval=2)


def _retry(flow_run_id: uuid.UUID, *, timeout: float = 900) -> Any:
    """A retry of a finished deployment flow run as the UI's Retry and `prefect flow-run retry` make it (the flow run
    set Scheduled, forced, for a worker to pick up), then the flow run once it is final again."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Scheduled

    async def go() -> Any:
        async with get_client() as client:
            before = await client.read_flow_run(flow_run_id)
            await client.set_flow_run_state(flow_run_id, Scheduled(message="Retried via CLI"), force=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                await asyncio.sleep(2)
                run = await client.read_flow_run(flow_run_id)
                if run.run_count > before.run_count and run.state is not None and run.state.is_final():
                    return run
                assert run.state is None or run.state.type != StateType.CRASHED, run.state
            raise AssertionError(f"the retry of flow run {flow_run_id} did not end within {timeout} s")

    return asyncio.run(go())


def _steps(run_dir: Path) -> set[int]:
    return {r["rollout_id"] for r in read_metrics(RunPaths(run_dir).metrics) if r["kind"] == "step"}


def _answers(api_url: str) -> bool:
    return httpx.get(f"{api_url}/health", timeout=10).status_code == 200


def _tiny(name: str, checkpoint: str, rollouts: int) -> dict:
    return {
        "name": name,
        "hf_checkpoint": checkpoint,
        "rollout": {"num_rollout": rollouts, "rollout_batch_size": 4, "n_samples_per_prompt": 4},
        "eval": {"eval_interval": None},
        "train": {"global_batch_size": 8},
    }


def test_the_readme_deployment_commands_reach_completed_in_order(deployed):
    """The README's commands after the worker's (a run of the deployed run flow, then a replay of its last train
    step, each watched to its end), as written."""
    assert [c.split()[:3] for c in deployed.rest] == [[".venv/bin/prefect", "deployment", "run"]] * 2
    for line in deployed.rest:
        done = deployed.run(line)
        assert isinstance(done, subprocess.CompletedProcess)
        assert done.returncode == 0, (
            f"{line}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n" + deployed.output("prefect")[-4000:]
        )
        assert "Flow run finished successfully in 'Completed'" in done.stdout
    assert _steps(deployed.checkout / "runs" / "deployed") == {0, 1, 2}
    assert "replay of train-step for rollout 2: identical" in deployed.output("prefect")


def test_a_served_schedule_runs_three_times_beside_the_worker_deployments(
    deployed, base_checkpoint, tmp_path
):
    """`rollflow serve --interval` on the server prefect.yaml is deployed to: its schedule runs three times in a row to
    Completed, each run in a run dir of its own; the worker's deployments keep their path and pull steps, and a
    replay of each kind (the served one's, the worker's) completes."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.exceptions import ObjectNotFound

    name = f"sched-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump(_tiny(name, base_checkpoint, 2)))

    async def worker_deployments() -> list[tuple]:
        async with get_client() as client:
            found = [
                await client.read_deployment_by_name(n)
                for n in ("rollflow-run/tiny-arith-worker", "replay/worker")
            ]
            return [(d.work_pool_name, d.path, d.pull_steps, d.entrypoint) for d in found]

    async def served_runs() -> tuple[uuid.UUID, list[Any]]:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(f"rollflow-run/{name}-served")
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
            )
            return deployment.id, runs

    async def stop_schedule(deployment_id: uuid.UUID, waiting: list[Any]) -> None:
        """The deployment paused and its runs still waiting deleted: pausing deletes only those due later, and serve
        starts a Late one still."""
        async with get_client() as client:
            await client.pause_deployment(deployment_id)
            for run in waiting:
                with contextlib.suppress(ObjectNotFound):
                    await client.delete_flow_run(run.id)

    with deployed.api():
        before = asyncio.run(worker_deployments())
        assert all(pool == "rollflow" and pull for pool, _, pull, _ in before)  # prefect deploy made them
        env = {**deployed.env, "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        with open(deployed.logs / "serve.log", "w") as log:
            serve = subprocess.Popen(
                ["scripts/rollflow", "serve", "--config", str(config), "--interval", "5"],
                cwd=deployed.checkout,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def output() -> str:
            return (deployed.logs / "serve.log").read_text()

        try:
            deadline, paused, runs = time.monotonic() + 1800, False, []
            while time.monotonic() < deadline:
                time.sleep(2)
                assert serve.poll() is None, output()[-4000:]
                with contextlib.suppress(ObjectNotFound):  # until serve has registered its deployments
                    deployment_id, found = asyncio.run(served_runs())
                    runs = [
                        r for r in found if r.state and r.state.type.value not in ("SCHEDULED", "PENDING")
                    ]
                    if len(runs) >= 3 and not paused:  # the third has started: the schedule's later runs go
                        waiting = [r for r in found if r.state and r.state.type.value == "SCHEDULED"]
                        asyncio.run(stop_schedule(deployment_id, waiting))
                        paused = True
                    if paused and all(r.state.is_final() for r in runs):
                        break
            assert paused and len(runs) == 3, output()[-4000:]
            assert [r.state.name for r in runs] == ["Completed"] * 3, output()[-4000:]
            run_dirs = {deployed.checkout / "runs" / f"{name}-{r.id.hex[-8:]}" for r in runs}
            assert set((deployed.checkout / "runs").glob(f"{name}-*")) == run_dirs
            for run_dir in run_dirs:
                assert _steps(run_dir) == {0, 1}
            # serving left the work pool's deployments as they were
            assert asyncio.run(worker_deployments()) == before
            # rollout 0's train step starts from the base model: the runs need no --save checkpoints
            first, second, _ = (
                {"run_dir": str(d), "rollout_id": 0, "task": "train-step"} for d in sorted(run_dirs)
            )
            served = _flow_run("replay/served", first)
            assert served.state.name == "Completed", output()[-4000:]
            assert "replay of train-step for rollout 0: identical" in output()  # run by serve
            worker = _flow_run("replay/worker", second)
            assert worker.state.name == "Completed", deployed.output("prefect")[-4000:]
        finally:
            _stop(serve)


def test_a_retry_from_the_api_resumes_its_own_run_and_refuses_another(deployed, base_checkpoint):
    """A worker's run that fails after its first rollout, retried as the UI's Retry does it: the worker resumes
    the run in its own run dir to Completed, and the flow run is never Crashed. A run into that run dir is refused,
    and so is its retry, with the reason in the flow run's state message. No failure stops the server."""
    from prefect.client.orchestration import get_client

    name = f"retry-{uuid.uuid4().hex[:6]}"
    cut = [
        {
            "request_id": "cut",
            "hook_name": "orchestrator_rollout_end",
            "action": {"kind": "raise"},
            "rollout_id": 0,
        }
    ]
    cfg = {**_tiny(name, base_checkpoint, 2), "faults": {"ci_fault_hooks": json.dumps(cut)}}

    async def states(flow_run_id: uuid.UUID) -> list[str]:
        async with get_client() as client:
            return [s.type.value for s in await client.read_flow_run_states(flow_run_id)]

    with deployed.api():
        failed = _flow_run("rollflow-run/tiny-arith-worker", {"cfg": cfg})
        assert failed.state.name == "Failed", deployed.output("prefect")[-4000:]
        assert _answers(deployed.api_url)  # the failed run left the server up
        run_dir = deployed.checkout / "runs" / f"{name}-{failed.id.hex[-8:]}"
        assert _steps(run_dir) == {0}

        retried = _retry(failed.id)
        assert retried.state.name == "Completed", deployed.output("prefect")[-4000:]
        assert retried.run_count == 2 and "CRASHED" not in asyncio.run(states(failed.id))
        assert list((deployed.checkout / "runs").glob(f"{name}-*")) == [run_dir]  # resumed its own run dir
        assert _steps(run_dir) == {0, 1}
        records = read_metrics(RunPaths(run_dir).metrics)
        per_rollout = collections.Counter(
            r["rollout_id"] for r in records if r["kind"] in ("rollout", "step")
        )
        assert per_rollout[0] == per_rollout[1]  # rollout 0's records once: the retry resumed after it
        assert len({r["run_id"] for r in records}) == 1  # the same run continued, not a new one in its dir
        recorded = RunPaths(run_dir).metrics.read_text()

        other = _flow_run(
            "rollflow-run/tiny-arith-worker",
            {"cfg": {**_tiny(name, base_checkpoint, 2), "run_dir": str(run_dir)}},
        )
        assert other.state.name == "Failed" and "holds the records of run" in other.state.message
        refused = _retry(other.id)
        assert refused.state.name == "Failed", refused.state.message
        assert "a retry resumes only its own run" in refused.state.message
        assert (
            f"flow run {failed.id}" in refused.state.message
            and f"not of flow run {other.id}" in refused.state.message
        )
        assert RunPaths(run_dir).metrics.read_text() == recorded  # the other run's records untouched
        assert _answers(deployed.api_url) and deployed.server.poll() is None


def test_serve_refuses_to_take_over_a_work_pool_deployment_of_its_name(prefect_server, tmp_path):
    """`rollflow serve` of a config whose run deployment a work pool already has: one line naming the deployment
    and what to do, exit 2, and the pool's deployment as it was."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL

    from flows.run import run_flow

    name, pool = f"taken-{uuid.uuid4().hex[:6]}", f"pool-{uuid.uuid4().hex[:6]}"
    pull = [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]

    async def deploy() -> tuple:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            flow_id = await client.create_flow(run_flow)
            deployment_id = await client.create_deployment(
                flow_id,
                f"{name}-served",
                work_pool_name=pool,
                path=str(ROOT),
                entrypoint="flows/run.py:run_flow",
                pull_steps=pull,
            )
            d = await client.read_deployment(deployment_id)
            return d.work_pool_name, d.path, d.pull_steps, d.entrypoint

    before = asyncio.run(deploy())
    (tmp_path / "my.yaml").write_text(yaml.safe_dump({"name": name}))
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    done = subprocess.run(
        ["scripts/rollflow", "serve", "--config", str(tmp_path / "my.yaml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"rollflow: error: rollflow serve will not take over deployment rollflow-run/{name}-served: it belongs to "
        f"work pool '{pool}' (prefect deploy), whose workers run it; delete it (prefect deployment delete "
        f"rollflow-run/{name}-served) or rename it in prefect.yaml, or serve a config of another name"
    ]

    async def after() -> tuple:
        async with get_client() as client:
            d = await client.read_deployment_by_name(f"rollflow-run/{name}-served")
            return d.work_pool_name, d.path, d.pull_steps, d.entrypoint

    assert asyncio.run(after()) == before


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
