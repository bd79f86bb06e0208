"""Seconds from `rollflow run` to its first rollout: what a user waits before anything trains.

Runs `python -m flows.cli run --verbose` on a one-rollout tiny-arith run (4 prompts x 4 samples, no eval, no
checkpoint) `--runs` times, each into a fresh run dir, and stamps each line of its output as it arrives. The
phases, in seconds from the launch:

- console: the header line (Python imports, the config resolved: tokenizer, data and reward checked);
- ray: "Started a local Ray instance";
- flow: the parent flow run begins (Prefect's temporary server is up and has recorded it);
- actors: the first sync task ends (engines, rollout actor and trainers started, the first weights synced);
- rollout 0: the first child flow run begins;
- exit: the process has ended (the run's end, the plots, the server and Ray stopped).

The first run uses an empty Prefect home, so its server creates the database (Prefect's migrations, once per
home); the later runs reuse it, as a user's runs share ~/.prefect. Medians are over those later runs.

    python bench/startup.py [--runs 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (phase, a text its line contains); the first matching line counts
MARKS = [
    ("console", "rollflow run startup-bench:"),
    ("ray", "Started a local Ray instance"),
    ("flow", "Beginning flow run"),
    ("actors", "Task run 'sync-"),
    ("rollout 0", "Beginning subflow run 'rollout-0'"),
]


def one_run(home: Path, run_dir: Path) -> dict[str, float]:
    """Launch one run; {phase: seconds from the launch}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "PREFECT_API"))}
    env.update({"PREFECT_HOME": str(home), "PYTHONPATH": str(ROOT)})
    flags = ["--name", "startup-bench", "--run-dir", str(run_dir), "--num-rollout", "1"]
    flags += ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "8"]
    flags += ["--eval-interval", "none", "--verbose"]
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "flows.cli", "run", *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    tail: deque[str] = deque(maxlen=40)  # printed if the run fails
    for line in proc.stdout:
        now = time.monotonic() - began
        tail.append(line)
        for phase, text in MARKS:
            if phase not in seen and text in line:
                seen[phase] = now
    proc.wait()
    seen["exit"] = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"rollflow run exited {proc.returncode}:\n{''.join(tail)}")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=4, help="runs in all; the first creates the Prefect database"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rf-bench-startup-"))
    phases = [p for p, _ in MARKS] + ["exit"]
    rows = []
    try:
        for i in range(args.runs):
            seen = one_run(work / "prefect", work / f"run-{i}")
            rows.append(seen)
            cells = "  ".join(f"{p} {seen[p]:5.1f}" if p in seen else f"{p} -" for p in phases)
            print(f"run {i}{' (new Prefect database)' if i == 0 else ''}: {cells}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    later = rows[1:]
    if later:
        print(f"\nmedians over runs 1..{len(rows) - 1} (seconds from the launch):")
        for p in phases:
            values = [r[p] for r in later if p in r]
            if values:
                print(f"  {p:10s} {statistics.median(values):6.1f}")


if __name__ == "__main__":
    main()
