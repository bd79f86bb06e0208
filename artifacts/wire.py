"""Named tensors as numpy arrays for Ray's object store.

Ray stores numpy arrays zero-copy and reads them without unpickling, while a torch tensor is pickled
byte by byte, which the weight sync would pay every rollout. dtypes numpy lacks (bfloat16, float8) travel
as their raw bits plus the dtype name.
"""

from __future__ import annotations

import warnings

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
