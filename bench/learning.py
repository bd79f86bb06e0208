"""Does the default run learn, on this machine? The README's Results table comes from this script.

Runs the default recipe (`rollflow run` with no flags but --rollout-seed and a run dir of its own) once
per rollout seed, each from an empty model cache so that its wall time includes the tiny-arith warm-up,
and prints, per run: the eval accuracy at the start, at the end and the best, the gain, and the wall
time. `--warmup-threads N` adds one run whose warm-up is built with N torch threads: a different float
reduction order, which is how another machine's kernels differ from this one's.

    python bench/learning.py [--seeds 42,1,2] [--warmup-threads 2] [--flags "--num-rollout 50"] [--bar 20]

The issue's bar (03b): every run ends >= 20 eval points above where it started, in under 10 minutes. The
Megatron backend's (06): `--flags "--train-backend megatron --ci-test" --bar 10`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._table import table  # noqa: E402

BAR_POINTS, BAR_SECONDS = 20.0, 600.0


def run_once(work: Path, seed: int, warmup_threads: int | None, flags: list[str]) -> dict:
    """One default run in its own run dir, model cache and Prefect home; returns its eval curve."""
    work.mkdir(parents=True)
    env = {**os.environ, "ROLLFLOW_CACHE_DIR": str(work / "cache"), "PREFECT_HOME": str(work / "prefect")}
    start = time.perf_counter()
    if warmup_threads is not None:  # built first, so the run finds it in the cache
        subprocess.run(
            [sys.executable, "-m", "recipes.tiny_arith.bootstrap", "--num-threads", str(warmup_threads)],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    run_dir = work / "run"
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        "--rollout-seed",
        str(seed),
        "--run-dir",
        str(run_dir),
        *flags,
    ]
    with open(work / "console.log", "w") as log:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"run failed (exit {done.returncode}): see {work / 'console.log'}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = {
        r["rollout_id"]: v
        for r in records
        if r["kind"] == "eval"
        for k, v in r["metrics"].items()
        if k.startswith("eval/") and k != "eval/step" and not k.endswith("-truncated_ratio")
    }
    info = json.loads(next((work / "cache").glob("tiny-arith-*/bootstrap_info.json")).read_text())
    return {
        "seed": seed,
        "warmup_threads": warmup_threads or 1,
        "curve": curve,
        "seconds": seconds,
        "warmup_seconds": info["seconds"],
        "greedy": info["eval_greedy_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="42,1,2", help="comma-separated --rollout-seed values")
    parser.add_argument(
        "--warmup-threads",
        type=int,
        default=2,
        help="one more run (first seed) with the warm-up built with this many threads; 0 = none",
    )
    parser.add_argument("--flags", default="", help="extra `rollflow run` flags for every run")
    parser.add_argument("--keep", action="store_true", help="keep the run dirs (printed)")
    parser.add_argument("--bar", type=float, default=BAR_POINTS, help="eval points every run must gain")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    plan: list[tuple[int, int | None]] = [(s, None) for s in seeds]
    if args.warmup_threads:
        plan.append((seeds[0], args.warmup_threads))
    base = Path(tempfile.mkdtemp(prefix="rf-bench-learning-"))
    results = []
    for i, (seed, threads) in enumerate(plan):
        results.append(run_once(base / f"run{i}", seed, threads, shlex.split(args.flags)))
        r = results[-1]
        print(
            f"seed {seed} (warm-up threads {r['warmup_threads']}): "
            + "  ".join(f"{k}:{v:.3f}" for k, v in sorted(r["curve"].items())),
            flush=True,
        )
    rows, ok = [], True
    for r in results:
        ids = sorted(r["curve"])
        first, last = r["curve"][ids[0]], r["curve"][ids[-1]]
        best_id = max(ids, key=lambda k: r["curve"][k])
        gain = 100 * (last - first)
        passed = gain >= args.bar and r["seconds"] < BAR_SECONDS
        ok &= passed
        rows.append(
            [
                str(r["seed"]),
                str(r["warmup_threads"]),
                f"{first:.3f}",
                f"{last:.3f}",
                f"{r['curve'][best_id]:.3f} @{best_id}",
                f"{gain:+.1f}",
                f"{r['greedy']:.3f}",
                f"{r['seconds']:.0f} s ({r['warmup_seconds']:.0f} s)",
                "yes" if passed else "NO",
            ]
        )
    print()
    print(
        table(
            [
                "seed",
                "warm-up threads",
                "eval start",
                "end",
                "best",
                "gain (pts)",
                "warm-up greedy",
                "wall (warm-up)",
                f">= +{args.bar:g} in < {BAR_SECONDS / 60:.0f} min",
            ],
            rows,
        )
    )
    print(f"\nrun dirs under {base}" if args.keep else "")
    if not args.keep:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
