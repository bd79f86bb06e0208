"""What a long-lived rollflow process (the run's driver, an engine or trainer actor) does to itself once it is
set up. A bottom package: it imports no other rollflow package."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, MutableMapping
from typing import Any


def freeze_heap() -> None:
    """Collect once, then move every object alive now to the GC's permanent generation.

    A set-up process holds hundreds of thousands of objects that live as long as it does: modules, classes, the
    config, a model's parameters and their wrappers. Each full (gen-2) collection would walk them all and stall a
    rollout. Frozen objects are never scanned again; what the process allocates later is collected as usual."""
    gc.collect()
    gc.freeze()


def preload_arrow() -> None:
    """Import now what pyarrow imports lazily, in a process that reads or writes artifacts.

    pyarrow imports pandas and its compute module at the first array it builds from Python objects. Left lazy,
    that import lands on the first rollout's path, in each process in turn. Done at set-up, before `freeze_heap`,
    the modules are frozen with the rest of the heap."""
    import pyarrow as pa

    pa.table({"x": pa.array([0], pa.int32())}).cast(pa.schema([("x", pa.int64())]))


_LOWERED: set[int] = set()  # processes whose priority this process lowered already


def lower_priority(pids: Iterable[int], increment: int) -> list[int]:
    """Raise the nice value of every thread of each process in `pids` by `increment` (capped at 19), at most once
    per process over this process's life; returns the pids lowered now. Linux keeps a nice value per thread, and a
    thread inherits its creator's, so every thread alive now is lowered (where there is no /proc, the process is).
    A thread or process that ended meanwhile, or that this process may not lower, is skipped. `increment` <= 0
    lowers nothing."""
    lowered: list[int] = []
    for pid in pids:
        if increment <= 0 or pid in _LOWERED:
            continue
        done = 0
        for tid in threads(pid):
            try:
                niceness = os.getpriority(os.PRIO_PROCESS, tid) + increment
                os.setpriority(os.PRIO_PROCESS, tid, min(19, niceness))
                done += 1
            # a thread that ended meanwhile, or another user's (not ours to lower)
            except (ProcessLookupError, PermissionError):
                continue
        if done:
            _LOWERED.add(pid)
            lowered.append(pid)
    return lowered


def threads(pid: int) -> list[int]:
    """The thread ids of process `pid` (Linux: /proc/PID/task); [pid] where there is no /proc."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return [pid]


_GIB = float(1 << 30)


def memory_gib(status: str | None = None) -> dict[str, float]:
    """{"rss": resident memory now, "peak": the highest resident memory over the process's life}, in GiB, from
    `status` (the text of /proc/<pid>/status: VmRSS and VmHWM, in kB) or this process's own status. Where there
    is no /proc, the peak comes from getrusage (ru_maxrss, kB on Linux, bytes on macOS) and rss is the peak."""
    if status is None:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                status = f.read()
        except OSError:
            import resource
            import sys

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            gib = peak / _GIB if sys.platform == "darwin" else peak * 1024 / _GIB
            return {"rss": gib, "peak": gib}
    kib: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            number, unit = value.split()
            if unit != "kB":
                raise ValueError(f"/proc status line {line!r}: expected a size in kB")
            kib[key] = int(number)
    if set(kib) != {"VmRSS", "VmHWM"}:
        raise ValueError(f"/proc status without VmRSS and VmHWM (found {sorted(kib)})")
    return {"rss": kib["VmRSS"] * 1024 / _GIB, "peak": kib["VmHWM"] * 1024 / _GIB}


# glibc's malloc as the run's processes use it (with_malloc_tunables says why)
MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": "1048576", "glibc.malloc.hugetlb": "1"}


def with_malloc_tunables(value: str | None) -> str:
    """GLIBC_TUNABLES (a colon-separated list of name=value; `value` is the variable as set, or None) with
    MALLOC_TUNABLES added; a tunable already named there keeps its value. glibc reads the variable once, as a
    process starts: set here, it reaches the processes started after, a local Ray's raylet and its workers.

    - mmap_threshold 1 MiB: every block this size or larger is mapped on its own and goes back to the OS when it
      is freed. glibc's default threshold grows up to 32 MiB as large blocks are freed, and keeps such blocks
      (activations, weight buckets, log-prob chunks) in its heap, resident until the process ends.
    - hugetlb 1: malloc's memory in transparent huge pages where the kernel offers them on request, so those
      mappings cost fewer page faults and TLB misses.
    An older glibc ignores a tunable it does not know; other C libraries ignore the variable."""
    pairs = [pair for pair in (value or "").split(":") if pair]
    named = {pair.split("=", 1)[0] for pair in pairs}
    pairs += [f"{name}={v}" for name, v in MALLOC_TUNABLES.items() if name not in named]
    return ":".join(pairs)


# the entries oneDNN's primitive cache and ideep's cache of computations keep (cap_kernel_caches says why)
KERNEL_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def cap_kernel_caches(environ: MutableMapping[str, str]) -> None:
    """Set KERNEL_CACHES in `environ` where they are not set already (a user's own values stay). The libraries
    read them at their first kernel, so set here they reach the processes started after (a local Ray's workers).

    PyTorch's CPU bf16 products run on oneDNN, through ideep. Each library caches a compiled kernel (and its
    buffers) for every shape it meets, up to 1,024 of each. Decoding meets a new attention shape every step, and
    a trainer one per micro-batch length, so both caches fill with kernels whose shapes do not come back: a 0.5B
    engine held ~265 MB more after one 256-token generate call, most of it kept through a release. 64 entries
    hold every shape one decode step or micro-batch repeats over its layers."""
    for name, value in KERNEL_CACHES.items():
        environ.setdefault(name, value)


def libc() -> Any:
    """The C library, loaded once, with errno kept for ctypes.get_errno; None where none is found."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name, use_errno=True) if name is not None else False
        except OSError:
            _LIBC = False
    return _LIBC or None


_LIBC: Any = None  # libc(): None until loaded, False where there is none


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim), so that memory freed by dropping large
    objects leaves the resident set and not only Python's accounting; False where the C library has no such call."""
    trim = getattr(libc(), "malloc_trim", None)  # not glibc (musl, macOS): none
    if trim is None:
        return False
    trim(0)
    return True
