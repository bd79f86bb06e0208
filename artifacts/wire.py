"""Named tensors as numpy arrays for Ray's object store.

Ray stores numpy arrays zero-copy and reads them without unpickling, while a torch tensor is pickled
byte by byte, which the weight sync would pay every rollout. dtypes numpy lacks (bfloat16, float8) travel
as their raw bits plus the dtype name. `write_file` / `read_file` move the same arrays through a file instead,
for a trainer and engines on one machine (a file in shared memory is freed once deleted, where the object
store's pages stay resident).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

WireWeights = dict[str, tuple[str, np.ndarray]]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_wire(named: dict[str, torch.Tensor]) -> WireWeights:
    """{name: (torch dtype name, contiguous CPU numpy array of the same bits)}."""
    out: WireWeights = {}
    for name, t in named.items():
        t = t.detach().cpu().contiguous()
        try:
            array = t.numpy()
        except TypeError:  # no numpy dtype: ship the bits
            array = t.view(_BITS[t.element_size()]).numpy()
        out[name] = (str(t.dtype).removeprefix("torch."), array)
    return out


def from_wire(wire: WireWeights, *, copy: bool = True) -> dict[str, torch.Tensor]:
    """Inverse of `to_wire`: CPU tensors with the original dtypes, shapes and bits, writable copies. With
    `copy=False` they are views of the arrays themselves (read-only ones into Ray's shared memory for an object
    from the store): for a caller that only reads them, such as an engine copying them into its weights, which
    then never holds a second copy of the weights."""
    out = {}
    with warnings.catch_warnings():  # torch warns that a read-only array's tensor must not be written
        warnings.simplefilter("ignore", UserWarning)
        for name, (dtype_name, array) in wire.items():
            t = torch.from_numpy(np.array(array, copy=True) if copy else array)
            dtype = getattr(torch, dtype_name)
            out[name] = t if t.dtype == dtype else t.view(dtype)
    return out


@dataclass(frozen=True)
class WireFile:
    """Named tensors written one after another into a file (`write_file`), for a reader on the same machine:
    (name, torch dtype name, numpy dtype of the bits as written, shape, byte offset) per tensor."""

    path: str
    tensors: tuple[tuple[str, str, str, tuple[int, ...], int], ...]


_ALIGN = 64  # each tensor starts on a cache line


def write_file(named: dict[str, torch.Tensor], path: Path) -> WireFile:
    """Write the tensors' bytes into a new file at `path` (an existing one is an error, never overwritten) and
    say where each lies. One copy, straight from each tensor: no second copy of the bucket is made."""
    entries, offset = [], 0
    with open(path, "xb") as f:
        for name, (dtype_name, array) in to_wire(named).items():
            pad = -offset % _ALIGN
            f.write(b"\0" * pad)
            offset += pad
            entries.append((name, dtype_name, array.dtype.str, tuple(array.shape), offset))
            array.tofile(f)
            offset += array.nbytes
    return WireFile(str(path), tuple(entries))


def read_file(wire: WireFile) -> dict[str, torch.Tensor]:
    """The tensors of `wire` as read-only views of its file mapped into memory (no copy; the mapping lasts as long
    as the tensors): for a reader that copies them into its own weights."""
    empty = Path(wire.path).stat().st_size == 0  # every tensor empty: nothing to map
    mapped = np.zeros(0, dtype=np.uint8) if empty else np.memmap(wire.path, dtype=np.uint8, mode="r")
    arrays: WireWeights = {}
    for name, dtype_name, bits, shape, offset in wire.tensors:
        dtype = np.dtype(bits)
        count = int(np.prod(shape, dtype=np.int64))
        arrays[name] = (
            dtype_name,
            mapped[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape),
        )
    return from_wire(arrays, copy=False)
