"""`rollflow server` as a user starts it: beside Prefect's server it serves the files under its directory, tells
runs where through a Prefect Variable (a run page's file link opens), and stops with Prefect's server."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from flows.files import VARIABLE
from flows.report import RunReport
from flows.run_page import RunPage
from tests.report_records import report_of

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _closed(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


async def _summary_posted(report: RunReport) -> str:
    """The summary artifact a run's page posts, as the server holds it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    page = RunPage(report, uuid.uuid4())
    await page.open()  # finds the file server, as at the start of a run
    async with get_client() as client:
        [summary] = await client.read_artifacts(
            artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=[page.ids["summary"]]))
        )
    return str(summary.data)


@pytest.mark.filterwarnings(
    "ignore:Artifact creation outside:FutureWarning"
)  # the page posts outside a run here
def test_rollflow_server_serves_a_runs_files_to_the_run_page_and_stops_with_prefect(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.variables import Variable

    api, files = _free_ports(2)
    run_dir = ROOT / "runs" / f"file-links-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"kind": "rollout", "rollout_id": 0}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # a new home, as a user's first server has
    out = tmp_path / "server.out"
    with out.open("w") as sink:
        server = subprocess.Popen(
            [str(ROOT / "scripts" / "rollflow"), "server", "--port", str(api), "--files-port", str(files)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not (said := re.search(r"served read-only at (\S+)/ ", out.read_text())):
            assert server.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        url = said.group(1)
        assert url == f"http://127.0.0.1:{files}"
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{api}/api"}):
            assert Variable.get(VARIABLE) == {"url": url, "root": str(ROOT.resolve())}
            markdown = asyncio.run(_summary_posted(report_of(tmp_path, 1, 2, {}, run_dir=str(run_dir))))
        [link] = re.findall(r"\[metrics\.jsonl\]\((\S+)\)", markdown)
        assert link == f"{url}/runs/{run_dir.name}/metrics.jsonl"
        with urllib.request.urlopen(link, timeout=10) as response:
            assert response.read() == (run_dir / "metrics.jsonl").read_bytes()
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(f"{url}/.venv/pyvenv.cfg", timeout=10)
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
        shutil.rmtree(run_dir)
    # Prefect's server's own status (the process is Prefect's, exec'd): uvicorn re-raises the signal once it stopped
    assert code == -signal.SIGTERM, out.read_text()[-3000:]
    deadline = time.monotonic() + 10  # the file server ends as it reads that Prefect's server has
    while not (_closed(api) and _closed(files)):
        assert time.monotonic() < deadline, f"still listening: {[p for p in (api, files) if not _closed(p)]}"
        time.sleep(0.2)
