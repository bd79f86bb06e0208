"""Per-layer model hashes (miles' `--ci-save-model-hash` layout).

SHA-256 over each parameter's name, shape string, dtype string and raw bytes, grouped by decoder
layer (`layer_0000`, ...) with everything else under `non_layer`, so a mismatch names the layer.
"""

from __future__ import annotations

import hashlib
import re

import torch

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def layer_hashes(named: dict[str, torch.Tensor]) -> dict[str, str]:
    """{"layer_0000": sha256, ..., "non_layer": sha256} over the given named tensors."""
    groups: dict[str, hashlib._Hash] = {}
    for name in sorted(named):
        t = named[name].detach().cpu().contiguous()
        m = _LAYER.search(name)
        key = f"layer_{int(m.group(1)):04d}" if m else "non_layer"
        h = groups.setdefault(key, hashlib.sha256())
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return {k: groups[k].hexdigest() for k in sorted(groups)}


def weights_sha256(named: dict[str, torch.Tensor]) -> str:
    """One sha256 over all layer hashes: the identity of a set of weights."""
    return hashlib.sha256(repr(sorted(layer_hashes(named).items())).encode()).hexdigest()
