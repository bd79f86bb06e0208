"""The memory of a process tree while it runs, read from /proc: each process's peak resident memory (VmHWM) and
the tree's memory at once (the sum of the processes' proportional set sizes, plus its weight-sync files in shared
memory), for bench/scaling.py's sides."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


class PeakMemory(threading.Thread):
    """Polls /proc once every `every` seconds for the peak resident memory (VmHWM) of process `root` and all its
    descendants, by pid, and for the tree's memory at once (the sum of their Pss), while it runs; `stop()` ends
    the polling."""

    def __init__(self, root: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.peaks: dict[int, tuple[str, float]] = {}  # pid -> (label, peak GiB)
        self.concurrent = 0.0  # the highest sum of Pss over the tree at one poll, GiB
        # label -> Pss GiB at that poll (labels several processes share summed)
        self.at_peak: dict[str, float] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.poll()
            self._stop_event.wait(self.every)

    def poll(self) -> None:
        from procs import memory_gib

        now, by_label = 0.0, {}
        pids = _tree(self.root)
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                mem = memory_gib(status)
                label = _label(pid)
            except (OSError, ValueError):  # ended meanwhile (a kernel thread has no VmHWM)
                continue
            pss = _pss_gib(pid, mem["rss"])
            now += pss
            by_label[label] = by_label.get(label, 0.0) + pss
            held = self.peaks.get(pid, ("", 0.0))
            self.peaks[pid] = (label or held[0], max(held[1], mem["peak"]))
        files = _sync_files_gib(pids)
        # memory no process's Pss holds until an engine maps it (then counted twice: an upper bound)
        if files:
            now += files
            by_label[SYNC_FILES] = files
        if now > self.concurrent:
            self.concurrent, self.at_peak = now, by_label

    def stop(self) -> dict[str, float]:
        """End the polling (one last poll first); {label: peak GiB} (a label several processes share is
        numbered)."""
        self.poll()
        self._stop_event.set()
        if self.ident is not None:  # started
            self.join()
        out: dict[str, float] = {}
        for label, peak in sorted(self.peaks.values(), key=lambda lp: -lp[1]):
            name, n = label, 1
            while name in out:
                n += 1
                name = f"{label}#{n}"
            out[name] = peak
        return out


SYNC_FILES = "sync files (shared memory)"


def _sync_files_gib(pids: list[int]) -> float:
    """GiB of the weight-sync files in shared memory (tasks/transfer.sync_files_dir) of the processes `pids`."""
    from tasks.transfer import SHARED_MEMORY, SYNC_FILES_PREFIX, sync_files_owner

    total, mine = 0, set(pids)
    with contextlib.suppress(OSError):
        for d in SHARED_MEMORY.glob(f"{SYNC_FILES_PREFIX}*"):
            if sync_files_owner(d) in mine:
                for f in d.iterdir():
                    with contextlib.suppress(OSError):  # deleted meanwhile
                        total += f.stat().st_blocks * 512
    return total / float(1 << 30)


def _pss_gib(pid: int, rss: float) -> float:
    """Process `pid`'s proportional set size in GiB (/proc/PID/smaps_rollup); `rss` where the kernel has none."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:  # no smaps_rollup (a kernel before 4.14), or the process ended
        return rss
    pss = [line.split()[1] for line in text.splitlines() if line.startswith("Pss:")]
    return int(pss[0]) * 1024 / float(1 << 30) if pss else rss


def _tree(root: int) -> list[int]:
    """`root` and every process below it (from each /proc/PID/stat's parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _label(pid: int) -> str:
    """A short name for a process of a run: Ray's actor or service, the Prefect server, or the program."""
    argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    if not argv:
        return "?"
    first = argv[0]
    if first.startswith("ray::"):  # an actor or worker: Ray sets its title
        return first.split()[0].split(".")[0]
    if any("uvicorn" in a for a in argv) or ("prefect" in argv and "server" in argv):
        return "prefect server"
    if "--side" in argv:
        return f"driver ({argv[argv.index('--side') + 1]} side)"
    for arg in argv[:3]:
        base = os.path.basename(arg)
        if base in ("gcs_server", "raylet") or base.endswith((".py", "_server")):
            return base
    return os.path.basename(first)
