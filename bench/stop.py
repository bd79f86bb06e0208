"""How fast does a run stop? `rollflow run` on a throw-away Prefect home, stopped once it is inside rollout
--at by Ctrl-C (SIGINT to its whole process group, as a terminal sends it) or SIGTERM (to the driver alone);
prints, per way: the seconds from the signal to the driver's exit, the exit code, the processes of the run
still alive 10 s later, and the run's last line.

    python bench/stop.py [--recipe tiny-arith|long-arith] [--at 3] [--ways ctrl-c,sigterm]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flows.reaper import _descendants, _stat  # noqa: E402

SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM}


def _inside(run_dir: Path, rollout_id: int) -> bool:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return False
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return any(r["kind"] == "step" and r["rollout_id"] >= rollout_id for r in records)


def stop_once(way: str, recipe: str, at: int, tmp: Path) -> dict:
    """One run stopped `way` inside rollout `at`: {seconds, code, left, last line}."""
    run_dir = tmp / way
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    args = ["--recipe", recipe, "--num-rollout", "1000", "--run-dir", str(run_dir), "--name", f"stop-{way}"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    while not _inside(run_dir, at):
        if driver.poll() is not None:
            raise SystemExit(
                f"the run ended before rollout {at}:\n{driver.stdout.read() if driver.stdout else ''}"
            )
        time.sleep(0.05)
    tree = _descendants(driver.pid)
    began = time.monotonic()
    if way == "ctrl-c":
        os.killpg(driver.pid, SIGNALS[way])
    else:
        os.kill(driver.pid, SIGNALS[way])
    out, _ = driver.communicate(timeout=600)
    seconds = time.monotonic() - began
    time.sleep(10)
    left = [p for p, s in tree.items() if (st := _stat(p)) is not None and st[1] == s and st[2] != "Z"]
    return {
        "seconds": seconds,
        "code": driver.returncode,
        "left": len(left),
        "last": out.strip().splitlines()[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="tiny-arith")
    parser.add_argument("--at", type=int, default=3, help="stop once the run is inside this rollout")
    parser.add_argument("--ways", default="ctrl-c,sigterm")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rf-bench-stop-"))
    print(f"{'way':<8} {'stop s':>7} {'exit':>5} {'left':>5}  last line")
    for way in args.ways.split(","):
        r = stop_once(way, args.recipe, args.at, tmp)
        print(f"{way:<8} {r['seconds']:>7.1f} {r['code']:>5} {r['left']:>5}  {r['last']}")


if __name__ == "__main__":
    main()
