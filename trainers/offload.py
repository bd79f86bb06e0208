"""--optimizer-offload-dir: AdamW's moments in a file on disk, in memory only while a step updates them.

A CPU trainer's float32 AdamW state is twice its weights (0.5B parameters: 3.7 GiB), and at its peak, the end of a
backward, it is resident beside the weights and the new gradients without being used. Here both moments of every
parameter live in one file, mapped shared into the trainer's memory (`torch.from_file`), so they are ordinary
tensors to AdamW, to checkpoints and to snapshots. Once used, their pages are written back and dropped from the
process and from the page cache; the next use reads them from disk. A step updates the parameters a chunk of
moments at a time (CHUNK_BYTES; a parameter larger than that is a chunk of its own) and drops each chunk after it,
and what the kernel mapped around it, at the end.
DeepSpeed's optimizer offload to NVMe does the same for a GPU; here the memory saved is the machine's RAM.

AdamW is elementwise per tensor, so a chunked step gives the same bits as one over every parameter. The file is
deleted as soon as it is mapped: it takes disk space while the trainer runs and leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch

from procs import libc

CHUNK_BYTES = 256 << 20  # the moments one step brings into memory at once
_MOMENTS = ("exp_avg", "exp_avg_sq")
_MS_SYNC, _MADV_DONTNEED = 4, 4  # Linux's values
_MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "hugetlbfs"}


def filesystem_of(path: Path) -> str:
    """The type of the filesystem that holds `path` (the longest mount point above it in /proc/mounts); "" where
    there is no /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    best, kind = "", ""
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


class DiskMoments:
    """AdamW's `exp_avg` and `exp_avg_sq` of `params` in one file under `directory`: [m_0, v_0, m_1, v_1, ...],
    each the shape of its parameter, float32."""

    def __init__(self, directory: str, params: Sequence[torch.nn.Parameter], rank: int) -> None:
        where = Path(directory)
        if any(p.device.type != "cpu" for p in params):
            raise ValueError(
                f"--optimizer-offload-dir {directory}: the trainer's parameters are on {params[0].device}; the "
                "moments' file is mapped into host memory, for a CPU trainer"
            )
        where.mkdir(parents=True, exist_ok=True)
        kind = filesystem_of(where)
        if kind in _MEMORY_FILESYSTEMS:
            raise ValueError(
                f"--optimizer-offload-dir {directory}: it is on {kind}, whose files are held in memory, so the "
                "moments would not leave it; give a directory on a disk"
            )
        self.params = list(params)
        self._starts: list[int] = []  # where each parameter's exp_avg starts, in float32 elements
        total = 0
        for p in self.params:
            self._starts.append(total)
            total += 2 * p.numel()
        self._bytes = 4 * total
        fd, path = tempfile.mkstemp(dir=where, prefix=f"adamw-moments-rank{rank}-", suffix=".bin")
        try:
            os.ftruncate(fd, self._bytes)  # reads as zeros: AdamW's initial moments, without writing them
            self._flat = torch.from_file(path, shared=True, size=total, dtype=torch.float32)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(path)  # the mapping and `fd` keep the file while the process lives
        self._fd = fd
        weakref.finalize(self, os.close, fd)  # the file's disk space goes back with the last reference
        self._libc = libc()
        if self._libc is None:
            raise OSError(
                "--optimizer-offload-dir needs the C library's msync and madvise, which this system lacks"
            )
        self._chunks = _chunks([2 * 4 * p.numel() for p in self.params], CHUNK_BYTES)

    def views(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Parameter `i`'s place in the file: (exp_avg, exp_avg_sq), each shaped like the parameter."""
        p, start, n = self.params[i], self._starts[i], self.params[i].numel()
        return self._flat[start : start + n].view_as(p), self._flat[start + n : start + 2 * n].view_as(p)

    def adopt(self, optimizer: torch.optim.Optimizer, indices: Sequence[int] | None = None) -> None:
        """Move the moments `optimizer` holds for parameters `indices` (all: None) into the file where they are
        not there already (a loaded checkpoint or a restored snapshot brings tensors of its own), then drop those
        pages from memory. A parameter without state gets its state at its first `step`."""
        chosen = range(len(self.params)) if indices is None else indices
        for i in chosen:
            state = optimizer.state.get(self.params[i])
            if not state:
                continue
            for key, view in zip(_MOMENTS, self.views(i), strict=True):
                held = state.get(key)
                if held is None or held.data_ptr() == view.data_ptr():
                    continue
                view.copy_(held)
                state[key] = view
        if chosen:
            self.drop(chosen[0], chosen[-1])

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer.step()`, one chunk of parameters at a time: the others' gradients are set aside meanwhile
        (AdamW skips a parameter without one), and each chunk's moments leave memory after its update."""
        grads = [p.grad for p in self.params]
        try:
            for first, last in self._chunks:
                chunk = range(first, last + 1)
                for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
                    p.grad = g if i in chunk else None
                for i in chunk:
                    if grads[i] is not None and not optimizer.state.get(self.params[i]):
                        optimizer.state[self.params[i]] = self._initial_state(i)
                optimizer.step()
                self.adopt(optimizer, chunk)
        finally:
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g
        # a fault maps the cached pages around it too (the kernel's fault-around), some of them other chunks'
        self.drop()

    def _initial_state(self, i: int) -> dict[str, torch.Tensor]:
        """AdamW's state before parameter `i`'s first step, its moments in the file: zero moments and a float32
        step count of 0, as AdamW would create (tests/unit/test_optimizer_offload.py holds it to that), without
        the moments' size in memory that AdamW's own would take."""
        m, v = self.views(i)
        m.zero_()  # the file may hold a failed step's values
        v.zero_()
        return {"step": torch.zeros((), dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}

    def drop(self, first: int = 0, last: int | None = None) -> None:
        """Write the moments of parameters `first`..`last` (inclusive; default all) to the file and drop their
        pages from this process and from the page cache; the next read takes them from disk."""
        last = len(self.params) - 1 if last is None else last
        self._drop_bytes(4 * self._starts[first], 4 * (self._starts[last] + 2 * self.params[last].numel()))

    def reading(self, named: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """`named` (some tensors of which are moments in the file, as AdamW's state holds them) for a reader that
        takes each tensor once, in turn (a save, a hash): a moment's pages leave memory when the next tensor is
        asked for, so the reader holds one in memory at a time."""
        return _OneAtATime(named, self)

    def _drop_tensor(self, t: torch.Tensor) -> None:
        base = self._flat.data_ptr()
        if t.numel() and base <= t.data_ptr() < base + self._bytes:
            lo = t.data_ptr() - base
            self._drop_bytes(lo, lo + t.numel() * t.element_size())

    def _drop_bytes(self, lo: int, hi: int) -> None:
        page = mmap.PAGESIZE
        lo = lo // page * page
        hi = min(-(-hi // page) * page, -(-self._bytes // page) * page)
        if hi <= lo:
            return
        base = ctypes.c_void_p(self._flat.data_ptr() + lo)
        for call, flag in ((self._libc.msync, _MS_SYNC), (self._libc.madvise, _MADV_DONTNEED)):
            if call(base, ctypes.c_size_t(hi - lo), flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{call.__name__} of the AdamW moments' file: {os.strerror(err)}")
        os.posix_fadvise(self._fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)


class _OneAtATime(Mapping[str, torch.Tensor]):
    """DiskMoments.reading: the tensor read before is let go as the next one is read."""

    def __init__(self, named: Mapping[str, torch.Tensor], moments: DiskMoments) -> None:
        self.named, self.moments = named, moments
        self._last: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._last is not None:
            self.moments._drop_tensor(self._last)
        self._last = self.named[name]
        return self._last

    def __iter__(self) -> Iterator[str]:
        return iter(self.named)

    def __len__(self) -> int:
        return len(self.named)


def _chunks(sizes: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive index ranges (first, last) of `sizes` whose sum stays within `budget`; an item over it alone."""
    out: list[tuple[int, int]] = []
    first, held = 0, 0
    for i, size in enumerate(sizes):
        if i > first and held + size > budget:
            out.append((first, i - 1))
            first, held = i, 0
        held += size
    if sizes:
        out.append((first, len(sizes) - 1))
    return out
