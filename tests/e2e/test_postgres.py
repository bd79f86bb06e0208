"""`rollflow server --database-url postgresql+asyncpg://...` on a real PostgreSQL (Debian's package, installed
when missing): two `rollflow run`s at once against it, both to Completed with their rollout flow runs, every
flow run written to PostgreSQL. The database is a throwaway cluster in a temp dir on a free port; the server,
the runs and PostgreSQL are stopped whatever the outcome."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "rf-secret-pw"  # the test checks it never reaches the server's output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _postgres_bin() -> Path:
    """The directory of PostgreSQL's server programs (initdb, pg_ctl), installing Debian's package when there is
    none; a machine that has neither nor can install it fails the test."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found and shutil.which("initdb") is None:
        assert shutil.which("apt-get") and os.geteuid() == 0, (
            "PostgreSQL is not installed and cannot be: this test installs Debian's package with apt-get as root"
        )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:  # a machine whose package lists were never fetched
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"apt-get install postgresql failed:\n{done.stderr[-3000:]}"
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    initdb = found[-1] if found else Path(shutil.which("initdb") or "initdb")
    return initdb.resolve().parent


@contextlib.contextmanager
def _postgres() -> Iterator[str]:
    """A PostgreSQL cluster of its own (data dir in a temp dir, 127.0.0.1 on a free port, password auth over
    TCP) with a user and a database for Prefect; yields the server's URL; stops the cluster and removes it."""
    bindir = _postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="rf-pg-", dir="/tmp"))
    # initdb and postgres refuse to run as root: as root, the cluster runs as the package's `postgres` user
    user = "postgres" if os.geteuid() == 0 else None
    if user:
        shutil.chown(root, user)
    as_owner = {"user": user, "cwd": root, "capture_output": True, "text": True}
    data, port = root / "data", _free_port()
    started = False
    try:
        pwfile = root / "pw"
        pwfile.write_text("super-pw\n")
        if user:
            shutil.chown(pwfile, user)
        done = subprocess.run(
            [bindir / "initdb", "-D", data, "-U", "postgres", "--pwfile", pwfile, "-A", "scram-sha-256"],
            timeout=300,
            **as_owner,
        )
        assert done.returncode == 0, f"initdb failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        pg_ctl, log = [bindir / "pg_ctl", "-D", data, "-w", "-t", "300"], root / "postgres.log"
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root}"
        done = subprocess.run([*pg_ctl, "-l", log, "-o", options, "start"], timeout=330, **as_owner)
        started = True
        assert done.returncode == 0, (
            f"PostgreSQL did not start:\n{log.read_text()[-3000:] if log.exists() else ''}"
        )
        for statement in (
            f"CREATE USER rollflow PASSWORD '{PASSWORD}'",
            "CREATE DATABASE prefect OWNER rollflow",
        ):
            done = subprocess.run(
                [bindir / "psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres"]
                + ["-v", "ON_ERROR_STOP=1", "-c", statement],
                env={**os.environ, "PGPASSWORD": "super-pw"},
                timeout=120,
                **as_owner,
            )
            assert done.returncode == 0, done.stderr
        yield f"postgresql+asyncpg://rollflow:{PASSWORD}@127.0.0.1:{port}/prefect"
    finally:
        if started:
            subprocess.run([*pg_ctl, "-m", "immediate", "stop"], timeout=330, **as_owner)
        shutil.rmtree(root, ignore_errors=True)


def _query(url: str, sql: str) -> str:
    """`sql`'s rows as psql prints them unaligned, run as the database's own user (what the server wrote)."""
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    done = subprocess.run(
        [_postgres_bin() / "psql", "-h", "127.0.0.1", "-p", port, "-U", "rollflow", "-d", "prefect", "-At"]
        + ["-c", sql],
        env={**os.environ, "PGPASSWORD": PASSWORD},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started in a session of its own, and everything it started (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _flow_runs(api: str, **flow_runs: object) -> list[dict]:
    response = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": flow_runs, "limit": 200}, timeout=60)
    response.raise_for_status()
    return response.json()


@pytest.mark.skipif(sys.platform != "linux", reason="PostgreSQL is started from Debian's package")
def test_two_runs_at_once_on_a_postgresql_server(tmp_path, base_checkpoint):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "PREFECT_API"))
    }
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)})
    started: list[subprocess.Popen] = []

    def launch(args: list[str], out: Path, extra: dict[str, str]) -> subprocess.Popen:
        with out.open("w") as log:
            proc = subprocess.Popen(
                [str(ROOT / "scripts" / "rollflow"), *args],
                cwd=ROOT,
                env={**env, **extra},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its process group: stopped with everything it started
            )
        started.append(proc)
        return proc

    with _postgres() as url:
        try:
            port = _free_port()
            api = f"http://127.0.0.1:{port}/api"
            server_log = tmp_path / "server.log"
            server = launch(
                ["server", "--port", str(port), "--files-port", "0", "--database-url", url], server_log, {}
            )
            deadline = time.monotonic() + 600  # Prefect's migrations on a new database, on two busy cores
            while True:
                assert server.poll() is None, f"rollflow server exited:\n{server_log.read_text()[-4000:]}"
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{api}/health", timeout=10).json() is True:
                        break
                assert time.monotonic() < deadline, f"no /api/health:\n{server_log.read_text()[-4000:]}"
                time.sleep(1)

            flags = ["--hf-checkpoint", base_checkpoint, "--num-rollout", "2", "--rollout-batch-size", "4"]
            flags += ["--n-samples-per-prompt", "4", "--global-batch-size", "8", "--eval-interval", "none"]
            runs = {
                name: launch(
                    ["run", "--name", name, "--run-dir", str(tmp_path / name), *flags],
                    tmp_path / f"{name}.log",
                    {"PREFECT_API_URL": api},
                )
                for name in ("pg-a", "pg-b")
            }
            for name, proc in runs.items():
                proc.wait(timeout=1200)
                assert proc.returncode == 0, (tmp_path / f"{name}.log").read_text()[-4000:]

            for name in runs:
                [parent] = _flow_runs(api, name={"any_": [f"run/{name}"]})
                assert parent["state_type"] == "COMPLETED", parent["state_name"]
                children = _flow_runs(api, parent_flow_run_id={"any_": [parent["id"]]})
                assert sorted((c["name"], c["state_type"]) for c in children) == [
                    ("rollout-0", "COMPLETED"),
                    ("rollout-1", "COMPLETED"),
                ]
            # the server kept them in PostgreSQL, not in a SQLite of its own
            rows = _query(url, "SELECT name FROM flow_run WHERE state_type = 'COMPLETED'")
            assert sorted(rows.split()) == ["rollout-0"] * 2 + ["rollout-1"] * 2 + ["run/pg-a", "run/pg-b"]
            assert not (tmp_path / "prefect" / "prefect.db").exists()
            assert (
                "rollflow server: database postgresql+asyncpg://rollflow:***@127.0.0.1"
                in server_log.read_text()
            )
        finally:
            for proc in reversed(started):
                _stop(proc)
        assert PASSWORD not in server_log.read_text()
