"""A run holds its run dir from the command line on, and the Prefect server it starts answers only its own
clients. Runs `rollflow run` as a user does, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _env(prefect_home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_AUTH", "PREFECT_API", "PREFECT_SERVER_API"))
    }
    return {
        **env,
        "PREFECT_HOME": str(prefect_home),
        "PYTHONPATH": str(ROOT),
        "PREFECT_LOGGING_LEVEL": "INFO",
    }


def _run(name: str, base_checkpoint: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    flags = [
        "--name",
        name,
        "--hf-checkpoint",
        base_checkpoint,
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "2",
    ]
    flags += ["--n-samples-per-prompt", "2", "--global-batch-size", "4", "--eval-interval", "none"]
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *flags],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_second_run_on_the_same_name_is_refused_before_anything_starts(
    tmp_path, prefect_home, base_checkpoint
):
    env = _env(prefect_home)
    runs = [_run("twin", base_checkpoint, tmp_path, env) for _ in range(2)]
    deadline = time.monotonic() + 600
    while all(r.poll() is None for r in runs):
        assert time.monotonic() < deadline, "neither run ended"
        time.sleep(0.05)
    refused, winner = runs if runs[0].poll() is not None else runs[::-1]
    out = refused.communicate()[0]
    still_running = winner.poll() is None
    won, _ = winner.communicate(timeout=600)
    assert winner.returncode == 0, won[-3000:]
    assert refused.returncode == 2, out[-3000:]
    assert still_running  # refused while the other run held the dir, not after it finished
    run_dir = tmp_path / "runs" / "twin"
    # its whole output: one line naming the dir and the process that holds it; no header, Ray or Prefect line
    (line,) = out.splitlines()
    assert line.startswith(f"rollflow: error: run dir {run_dir} is in use by pid {winner.pid} on host "), out
    assert line.endswith("; wait for it, or give another --name/--run-dir"), out
    assert [json.loads(line)["kind"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()].count(
        "step"
    ) >= 1


PROBE = textwrap.dedent(
    """
    import asyncio, json, uuid, httpx
    from flows.cli import configure_prefect_env
    configure_prefect_env()  # as `rollflow run` does, before Prefect is imported
    from prefect.client.orchestration import get_client
    from prefect.server.api.server import SubprocessASGIServer
    from flows.prefect_private import start_temporary_server
    from flows.runtime import _api_headers
    start_temporary_server()
    (server,) = SubprocessASGIServer._instances.values()
    url = server.api_url
    async def client_reads():
        async with get_client() as client:
            return len(await client.read_flows()) >= 0
    result = {
        "url": url,
        "anonymous": httpx.post(f"{url}/flows/filter", json={}).status_code,
        "wrong": httpx.post(f"{url}/flows/filter", json={}, auth=("", "")).status_code,
        "watchdog": httpx.get(f"{url}/flow_runs/{uuid.uuid4()}", headers=_api_headers()).status_code,
        "health": httpx.get(f"{url}/health").status_code,
        "client": asyncio.run(client_reads()),
    }
    server.stop()
    print(json.dumps(result))
    """
)


def test_a_runs_temporary_prefect_server_refuses_clients_without_the_runs_string(prefect_home):
    env = _env(prefect_home)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["url"].startswith("http://127.0.0.1:")
    assert result["anonymous"] == 401 and result["wrong"] == 401
    assert result["client"] is True  # Prefect's own client sends the string
    assert result["watchdog"] == 404  # the API watchdog's raw reads too (a flow run the server does not know)
    assert result["health"] == 200  # Prefect leaves its health check open (the server's start-up polls it)
