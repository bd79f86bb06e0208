"""A safetensors file written one tensor at a time, from a mapping read in order: the writer holds one tensor's
bytes at once, and a mapping that lets each tensor's memory go once the next is asked for (trainers/offload.py's
moments on disk) keeps only one in memory. The file is what `safetensors.torch.save_file` writes: an 8-byte
little-endian header length, the JSON header (padded with spaces to 8 bytes), then each tensor's bytes in order."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    path: str | Path, named: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write `named` (CPU tensors) to `path` in the safetensors format, in sorted name order; `named` is read once
    for the header (shapes and dtypes only: no data) and once per tensor for its bytes, in that order. ValueError
    naming the tensor for a dtype safetensors has no name for."""
    names = sorted(named)
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in names:
        t = named[name]
        if t.dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} is {t.dtype}, which safetensors does not store")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "xb") as f:  # never over a file there: a save writes into its own new directory
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            t = named[name].detach().contiguous()
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy().data)
