"""A run leaves nothing behind, however its driver ends (`kill -9` included).

`rollflow run` starts Prefect's ephemeral server and a local Ray (GCS, raylet, agents, workers) as child
processes. When the driver is killed they are orphaned and keep running. `start_reaper` starts a small watcher
before any of them exist: this file, run by a fresh interpreter that holds none of the driver's memory (a
fork would keep a copy of every page the driver writes after it, hundreds of MB once torch is imported). The
watcher records the driver's process tree every half second. Once the driver is gone, it sends SIGTERM, then
SIGKILL after a grace period, to every process of that tree still alive. Pids are checked against their start
time, so a reused pid is never hit.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

_PROC = "/proc"
# kept: a dropped handle of a live child warns as it is collected
_reaper: subprocess.Popen[bytes] | None = None


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time in clock ticks, state) of a live process, None if it is gone."""
    try:
        with open(f"{_PROC}/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid ... starttime is field 22
    return int(fields[1]), int(fields[19]), fields[0]


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of `root`."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir(_PROC):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None and st[2] != "Z":
            children.setdefault(st[0], []).append(int(name))
            starts[int(name)] = st[1]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


def _alive(tree: dict[int, int]) -> dict[int, int]:
    """The processes of `tree` still running as the same process (same start time), plus their descendants."""
    live = {}
    for pid, start in tree.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            live[pid] = start
    for pid in list(live):
        live.update(_descendants(pid))
    return live


def _watch(driver: int, fd: int, grace: float) -> None:
    tree: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready and not os.read(fd, 64):  # EOF: the driver is gone (its end of the pipe closed with it)
            break
        if _stat(driver) is None:
            break
        tree.update(_descendants(driver))
    tree.pop(os.getpid(), None)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        live = _alive(tree)
        for pid in live:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while wait and time.monotonic() < deadline and _alive(live):
            time.sleep(0.1)


def start_reaper(grace: float = 3.0) -> None:
    """Start the watcher (see the module docstring). Call it before any child process is started."""
    global _reaper
    read_end, write_end = os.pipe()  # not inherited by exec'd children: only the driver keeps the write end
    _reaper = subprocess.Popen(
        # isolated and without site: the standard library is all it imports
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), str(read_end), str(grace)],
        pass_fds=(read_end,),  # every other descriptor stays here (a run dir's lock among them)
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # out of the terminal's process group: Ctrl-C stops the run, not its reaper
    )
    os.close(read_end)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
