"""The run's Ray processes allocate under glibc's malloc settings of procs.with_malloc_tunables: a large block is
mapped on its own and goes back to the OS when freed, also after a larger one was freed (which, under glibc's
defaults, raises the threshold and keeps the next blocks in the heap)."""

from __future__ import annotations

import ctypes
import ctypes.util

MIB = 1 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def _mapped_bytes_of_a_block_after_a_larger_one_was_freed() -> int:
    """In this process: free a 24 MiB block, allocate 16 MiB; the bytes malloc has in mappings of their own."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = _Mallinfo2
    libc.free(libc.malloc(24 * MIB))
    block = libc.malloc(16 * MIB)
    try:
        return int(libc.mallinfo2().hblkhd)
    finally:
        libc.free(block)


def test_a_ray_worker_maps_large_blocks_of_its_own(ray_session):
    import os

    mapped = ray_session.get(
        ray_session.remote(_mapped_bytes_of_a_block_after_a_larger_one_was_freed).remote()
    )
    assert mapped >= 16 * MIB, (mapped, os.environ.get("GLIBC_TUNABLES"))


def test_a_ray_worker_caps_the_kernel_caches(ray_session):
    import os

    from procs import KERNEL_CACHES

    def caches() -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in KERNEL_CACHES}

    assert ray_session.get(ray_session.remote(caches).remote()) == KERNEL_CACHES
