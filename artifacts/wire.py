"""Named tensors as numpy arrays for Ray's object store.

Ray stores numpy arrays zero-copy and reads them without unpickling, while a torch tensor is pickled
byte by byte, which the weight sync would pay every rollout. dtypes numpy lacks (bfloat16, float8) travel
as their raw bits plus the dtype name.
"""

from __future__ import annotations

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


def from_wire(wire: WireWeights) -> dict[str, torch.Tensor]:
    """Inverse of `to_wire`: writable CPU tensors with the original dtypes, shapes and bits."""
    out = {}
    for name, (dtype_name, array) in wire.items():
        dtype = getattr(torch, dtype_name)
        # copy: arrays from the object store are read-only views into shared memory
        t = torch.from_numpy(np.array(array, copy=True))
        out[name] = t if t.dtype == dtype else t.view(dtype)
    return out
