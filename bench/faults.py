"""Every fault hook x every action kind: is it survived, bitwise, or does it fail naming hook, action and rollout?

Each cell is a real `rollflow run` (a subprocess, as a user starts it) of a small config with one fault request
at rollout 1, compared with `rollflow diff` against a fault-free run of the same config. A cell whose driver
dies or hangs (the orchestrator's own process faults) is killed after a wall limit and continued with
`rollflow run --resume`, as a user would; the table says which cells needed that.

    python bench/faults.py [--hooks h1,h2] [--actions a1,a2] [--limit 240]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._table import table  # noqa: E402
from faults.models import ACTION_KINDS, HOOKS  # noqa: E402
from flows.diff import first_divergence  # noqa: E402

ACTIONS = {kind: {"kind": kind, **({"seconds": 3.0} if kind == "sleep" else {})} for kind in ACTION_KINDS}
ACTIONS["freeze_process"] = {"kind": "freeze_process", "seconds": 600.0}


def flags(run_dir: Path, checkpoint: str) -> list[str]:
    return [
        "--run-dir",
        str(run_dir),
        "--hf-checkpoint",
        checkpoint,
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "8",
        "--lr",
        "1e-2",
        "--eval-interval",
        "none",
        "--save",
        str(run_dir / "ckpt"),
        "--save-interval",
        "1",
        "--ci-save-model-hash",
        "--task-retry-delay",
        "0",
        "--rollout-timeout",
        "20",
        "--train-timeout",
        "20",
        "--update-weights-timeout",
        "20",
        "--prefect-timeout",
        "30",
    ]


def rollflow(args: list[str], env: dict[str, str], limit: float) -> tuple[int | None, str]:
    """Run `rollflow run ARGS`; (exit code, or None when it was killed at `limit` seconds; its output)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.kill()  # the reaper stops its Prefect server and Ray
        out, _ = proc.communicate()
        time.sleep(5)
        return None, out


def last_error(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("rollflow: ")]
    return lines[-1][:160] if lines else (out.strip().splitlines() or ["(no output)"])[-1][:160]


def cell(
    work: Path, baseline: Path, checkpoint: str, hook: str, action: str, env: dict[str, str], limit: float
) -> tuple[str, str, float]:
    """(outcome, detail, seconds) of one hook x action."""
    run_dir = work / f"{hook}-{action}"
    request = {
        "request_id": f"{hook}-{action}",
        "hook_name": hook,
        "action": ACTIONS[action],
        "rollout_id": 1,
        "attempt": 0,
    }
    began = time.perf_counter()
    code, out = rollflow([*flags(run_dir, checkpoint), "--ci-fault-hooks", json.dumps([request])], env, limit)
    how = "survived"
    if code != 0:  # the driver died or hung, or the run failed: continue it as a user would
        detail = f"exit {code}" if code is not None else f"killed after {limit:g} s"
        code, out2 = rollflow(["--resume", str(run_dir)], env, limit)
        if code != 0:
            return (
                "FAILED",
                f"{detail}; resume: {last_error(out2)}; first: {last_error(out)}",
                time.perf_counter() - began,
            )
        how = f"survived after --resume ({detail})"
    diff = first_divergence(baseline, run_dir)
    fired = (run_dir / "faults.jsonl").is_file() and '"fired"' in (run_dir / "faults.jsonl").read_text()
    if not fired:
        return "NOT FIRED", "the hook was never reached", time.perf_counter() - began
    if diff is not None:
        return "DIFFERS", diff, time.perf_counter() - began
    return how, "identical to the fault-free run", time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hooks", default=",".join(HOOKS))
    parser.add_argument("--actions", default=",".join(ACTION_KINDS))
    parser.add_argument("--limit", type=float, default=240.0, help="seconds before a hung run is killed")
    args = parser.parse_args()
    from recipes.tiny_arith.bootstrap import ensure_checkpoint

    checkpoint = str(ensure_checkpoint())
    work = Path(tempfile.mkdtemp(prefix="rf-bench-faults-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "PREFECT_API"))}
    env.update(
        {"PREFECT_HOME": str(work / "prefect"), "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "INFO"}
    )
    baseline = work / "baseline"
    code, out = rollflow(flags(baseline, checkpoint), env, args.limit)
    if code != 0:
        raise SystemExit(f"the fault-free run failed: {last_error(out)}")
    rows = []
    for hook in args.hooks.split(","):
        for action in args.actions.split(","):
            outcome, detail, seconds = cell(work, baseline, checkpoint, hook, action, env, args.limit)
            rows.append([hook, action, outcome, f"{seconds:.0f} s", detail])
            print(" | ".join(rows[-1]), flush=True)
    print()
    print(table(["hook", "action", "outcome", "wall", "detail"], rows))
    print(
        f"\n{sum(r[2].startswith('survived') for r in rows)} of {len(rows)} cells survived, identical to the "
        f"fault-free run; work dir {work}"
    )


if __name__ == "__main__":
    main()
