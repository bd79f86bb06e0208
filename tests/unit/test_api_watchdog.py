"""The Prefect API watchdog (--prefect-timeout): a run whose API stops answering ends with a message naming the
API and how to continue, instead of Prefect's client retrying for minutes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing answers there


def test_an_api_that_stops_answering_ends_the_process_with_a_message(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/api"
    script = (
        "import time; from pathlib import Path; from flows.runtime import start_api_watchdog; "
        f"start_api_watchdog({url!r}, 0.8, Path({str(tmp_path)!r})); time.sleep(30)"
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 75 and time.monotonic() - began < 20
    assert f"the Prefect API at {url} has not answered for 0.8 s (--prefect-timeout)" in done.stderr
    assert f"rollflow run --resume {tmp_path}" in done.stderr


def test_a_stopped_watchdog_never_fires(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/api"
    script = (
        "import time; from pathlib import Path; from flows.runtime import start_api_watchdog; "
        f"stop = start_api_watchdog({url!r}, 0.8, Path({str(tmp_path)!r})); stop.set(); time.sleep(2.5); "
        "print('alive')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "alive" in done.stdout, done.stderr[-500:]
