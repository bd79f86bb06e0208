"""What --ci-test's re-execution check costs (trainers/determinism.py: each rollout's first micro-batch re-run from
its step-boundary snapshot, log-prob pass and train step, compared bit for bit): `rollflow run --ci-test` on a
recipe with and without `--ci-disable-reexecution-checker`, alternated, each in its own run dir under one Prefect
home. Prints per variant the run's wall seconds and the summed perf/actor_train_time (the train step, which holds
the check), medians of --repeats, and their ratios.

    python bench/reexecution.py [--recipe tiny-arith|long-arith] [--num-rollout 3] [--repeats 2] [-- FLAGS...]

(long-arith's model samples above --ci-entropy-max's default 0.7: pass `-- --ci-entropy-max 2`.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(
    recipe: str, num_rollout: int, run_dir: Path, home: Path, check: bool, flags: list[str]
) -> tuple[float, float]:
    """(wall seconds, summed perf/actor_train_time) of one `rollflow run --ci-test`."""
    cmd = [sys.executable, "-m", "flows.cli", "run", "--recipe", recipe, "--ci-test"]
    cmd += ["--num-rollout", str(num_rollout), "--run-dir", str(run_dir), "--overwrite", *flags]
    if not check:
        cmd.append("--ci-disable-reexecution-checker")
    env = {**os.environ, "PREFECT_HOME": str(home)}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train = sum(r["metrics"].get("perf/actor_train_time", 0.0) for r in records if r["kind"] == "perf")
    return wall, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", choices=["tiny-arith", "long-arith"], default="tiny-arith")
    ap.add_argument("--num-rollout", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("flags", nargs="*", help="more `rollflow run` flags, after --")
    args = ap.parse_args()
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "prefect"
        _run(
            args.recipe, 1, Path(tmp) / "warm", home, False, args.flags
        )  # migrates the Prefect home, fills caches
        for i in range(args.repeats):
            for check in (False, True):
                run_dir = Path(tmp) / f"r{i}{check}"
                times[check].append(_run(args.recipe, args.num_rollout, run_dir, home, check, args.flags))
    wall = {c: statistics.median(t[0] for t in times[c]) for c in times}
    train = {c: statistics.median(t[1] for t in times[c]) for c in times}
    print(f"{args.recipe}, --ci-test, {args.num_rollout} rollouts, medians of {args.repeats}:")
    print(f"  {'':28s} {'run wall s':>10s} {'train-step s':>12s}")
    print(f"  {'without the re-execution':28s} {wall[False]:10.1f} {train[False]:12.2f}")
    print(f"  {'with it (the default)':28s} {wall[True]:10.1f} {train[True]:12.2f}")
    print(f"  {'ratio':28s} {wall[True] / wall[False]:10.2f} {train[True] / train[False]:12.2f}")


if __name__ == "__main__":
    main()
