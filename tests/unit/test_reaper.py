"""The reaper (flows/reaper.py) holds nothing of the driver's: a lock the driver releases is free at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_DRIVER = """
import sys
import time
from artifacts import rundir
from flows.reaper import start_reaper

lock = rundir.acquire(sys.argv[1])
start_reaper()
lock.close()
deadline = time.monotonic() + 30  # the reaper is given none of the driver's descriptors; a hang guard only
while True:
    try:
        again = rundir.acquire(sys.argv[1])  # the same run taken again in this process (a second in-process run)
        break
    except rundir.RunDirBusy as e:
        if time.monotonic() > deadline:
            print(e)
            raise SystemExit(1)
        time.sleep(0.05)
again.close()
"""


def test_a_run_dir_lock_released_by_the_driver_is_free_while_its_reaper_lives(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


_BIG_DRIVER = """
from pathlib import Path
from flows import reaper

held = b"x" * (256 << 20)  # 256 MiB the driver has written, as imported torch and a loaded tokenizer are
reaper.start_reaper()
status = Path(f"/proc/{reaper._reaper.pid}/status").read_text()
print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
"""


def test_the_reaper_holds_none_of_the_drivers_memory():
    """A forked reaper would map the driver's pages (and keep a copy of each the driver writes since); a fresh
    interpreter maps a few MB of its own."""
    done = subprocess.run(
        [sys.executable, "-c", _BIG_DRIVER], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split()[-1]) < 64 << 10, f"the reaper's VmRSS is {done.stdout.split()[-1]} kB"
