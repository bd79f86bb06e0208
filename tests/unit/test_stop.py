"""flows/stop.py: a stop request, from a signal handler or another thread, cancels the run flow's task once, as a
cancel Prefect's engine recognises; a second Ctrl-C ends the process at once; the stop line says why, where and
how to continue."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flows import stop
from flows.prefect_private import cancel_intended, clear_cancel_intent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_intent_left():
    yield
    clear_cancel_intent()
    stop._last = stop._active = None
    stop._line = None


def test_a_request_from_another_thread_cancels_the_task_once_as_a_prefect_cancel():
    async def main() -> tuple[str | None, int]:
        stopper = stop.Stopper(asyncio.get_running_loop(), asyncio.current_task())
        stop._last = stopper
        threading.Timer(0.1, stopper.request, [stop.PREFECT_CANCEL]).start()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopper.request(stop.SIGTERM)  # a later request changes nothing and cancels nothing more
            await asyncio.sleep(0.05)  # the task is not cancelled again
            return stopper.reason, asyncio.current_task().cancelling()
        return None, 0

    assert asyncio.run(main()) == (stop.PREFECT_CANCEL, 1)
    assert cancel_intended() and stop.stop_reason() == stop.PREFECT_CANCEL


def test_the_stop_line_says_why_where_and_how_to_continue():
    assert stop.stopped_line(3, 10, "runs/x") is None  # not stopped: the run failed
    stop._last = stop.Stopper(asyncio.new_event_loop(), None)  # type: ignore[arg-type]
    stop._last.reason = stop.CTRL_C
    line = stop.stopped_line(3, 10, "runs/x")
    assert line == (
        "stopped by Ctrl-C in rollout 3 (3/10 rollouts complete); continue with `rollflow run --resume runs/x`"
    )
    assert stop.last_line() == line and stop.EXIT_CODES[stop.CTRL_C] == 130


def test_a_second_ctrl_c_exits_at_once():
    script = (
        "import asyncio, signal, time\n"
        "from flows import stop\n"
        "async def main():\n"
        "    s = stop.Stopper(asyncio.get_running_loop(), asyncio.current_task())\n"
        "    s.request(stop.CTRL_C)\n"
        "    try:\n"
        "        await asyncio.sleep(30)\n"
        "    except asyncio.CancelledError:\n"
        "        s.request(stop.CTRL_C)\n"
        "        time.sleep(30)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130 and "second Ctrl-C: exiting now" in done.stderr
