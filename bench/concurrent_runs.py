"""Two (or more) `rollflow run`s at once against one `rollflow server`: each rollout's wall time, the longest
stall, and how often the server's database refused a write.

Starts `rollflow server` on a free port with a Prefect home of its own (SQLite by default, or `--database-url`,
e.g. a PostgreSQL), waits for its API, then launches `--runs` runs of `--recipe` at once, each with its own
local Ray, and waits for them. Per run it prints the rollouts' wall times (`perf/step_time` in the run dir's
metrics.jsonl: from a child flow run's start to the parent's record of its end), their median and maximum; the
stall is a rollout's time over its run's median. From the server's log (retryable errors logged) it counts the
requests answered 503 and the "database is locked" errors, by where they happened (an API route or a service).

    python bench/concurrent_runs.py [--num-rollout 20] [--runs 2] [--recipe tiny-arith]
    python bench/concurrent_runs.py --database-url postgresql+asyncpg://USER:PASSWORD@127.0.0.1:5432/prefect
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`python -m flows.cli ARGS` in a session of its own (stopped with everything it starts), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise SystemExit(f"rollflow server exited {server.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api}/health", timeout=10).json() is True:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"no answer from {api}/health after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def step_times(run_dir: Path) -> dict[int, float]:
    """{rollout id: seconds} from the run dir's `perf/step_time` records."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        r["rollout_id"]: r["metrics"]["perf/step_time"]
        for r in records
        if r["kind"] == "perf" and "perf/step_time" in r["metrics"]
    }


# A log record's first line (Prefect's server format), and the frame of a traceback that names Prefect's code
_RECORD = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \| (\w+) +\| ([\w.]+) - (.*)")
_FRAME = re.compile(r'prefect/server/((?:api|services|events|models)/[\w/]+)\.py", line \d+, in (\w+)')


def server_errors(log: Path) -> dict[str, int]:
    """Counts in the server's log (retryable errors logged): requests answered 503, by the API function that
    was refused, and "database is locked" errors of the server's services, by the service's function. (uvicorn
    logs each 503 a second time: those records are left out.)"""
    counts: collections.Counter[str] = collections.Counter()
    record: tuple[str, str] | None = None  # (logger, the first Prefect API/service frame of its traceback)
    locked = False

    def close() -> None:
        if record is not None and record[0] != "uvicorn.error":
            logger, frame = record
            if logger == "prefect.server" and "api/" in frame:
                counts[f"503 {frame}"] += 1
            elif locked:
                counts[f"locked {logger} {frame}"] += 1

    for line in log.read_text(errors="replace").splitlines():
        if found := _RECORD.match(line):
            close()
            record, locked = (
                ((found.group(2), ""), False) if found.group(1) in ("ERROR", "WARNING") else (None, False)
            )
        elif record is not None:
            locked = locked or "database is locked" in line
            if not record[1] and (frame := _FRAME.search(line)) and not frame.group(1).endswith("api/server"):
                record = (record[0], f"{frame.group(1)}.{frame.group(2)}")
    close()
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-rollout", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2, help="runs started at once")
    parser.add_argument("--recipe", default="tiny-arith")
    parser.add_argument(
        "--database-url", help="the server's database (default: SQLite in a temp Prefect home)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, run dirs) and print it")
    parser.add_argument(
        "run_flags", nargs=argparse.REMAINDER, help="after --: more `rollflow run` flags, for every run"
    )
    args = parser.parse_args()
    extra = [f for f in args.run_flags if f != "--"]

    tmp = Path(tempfile.mkdtemp(prefix="rf-concurrent-"))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "PREFECT_API"))
    }
    env.update({"PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": str(ROOT)})
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_args = ["server", "--port", str(port)]
    if args.database_url:
        server_args += ["--database-url", args.database_url]
    server_log = tmp / "server.log"
    # the server logs each retryable error (a 503, a service's refused write) with its traceback
    server = start(server_args, {**env, "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}, server_log)
    procs: dict[str, subprocess.Popen] = {}
    try:
        wait_healthy(api, server, server_log, timeout=600)
        began = time.monotonic()
        for i in range(args.runs):
            name = f"concurrent-{i}"
            flags = ["--name", name, "--run-dir", str(tmp / name), "--recipe", args.recipe]
            flags += ["--num-rollout", str(args.num_rollout), *extra]
            procs[name] = start(["run", *flags], {**env, "PREFECT_API_URL": api}, tmp / f"{name}.log")
        for name, proc in procs.items():
            if proc.wait() != 0:
                raise SystemExit(
                    f"{name} exited {proc.returncode}:\n{(tmp / f'{name}.log').read_text()[-3000:]}"
                )
        wall = time.monotonic() - began
    finally:
        for proc in [*procs.values(), server]:
            stop(proc)

    backend = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"{args.runs} runs x {args.num_rollout} rollouts of {args.recipe} at once on {backend}: {wall:.1f} s"
    )
    worst = 0.0
    for name in procs:
        times = step_times(tmp / name)
        median = statistics.median(times.values())
        slowest = max(times, key=times.__getitem__)
        worst = max(worst, times[slowest] - median)
        listed = " ".join(f"{times[r]:.2f}" for r in sorted(times))
        print(f"{name}: rollout s [{listed}]")
        print(
            f"{name}: median {median:.2f} s, max {times[slowest]:.2f} s (rollout {slowest}, "
            f"+{times[slowest] - median:.2f} s over the median)"
        )
    print(f"max stall (a rollout's time over its run's median): {worst:.2f} s")
    errors = server_errors(server_log)
    print(f"server: {sum(v for k, v in errors.items() if k.startswith('503'))} requests answered 503")
    for where, count in sorted(errors.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {where}")
    if args.keep:
        print(f"kept: {tmp}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
