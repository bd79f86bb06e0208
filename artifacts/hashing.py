"""Per-layer and per-tensor model hashes (miles' `--ci-save-model-hash` layout).

SHA-256 over each parameter's name, shape string, dtype string and raw bytes, grouped by decoder
layer (`layer_0000`, ...) with everything else under `non_layer`, so a mismatch names the layer.
`tensor_hashes` keeps one hash per tensor, so a mismatch can name the tensor itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping

import torch

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def layer_of(name: str) -> str:
    """The layer key of a tensor name: `layer_0003` for `model.layers.3.mlp.up_proj.weight`, else `non_layer`."""
    m = _LAYER.search(name)
    return f"layer_{int(m.group(1)):04d}" if m else "non_layer"


def group_by_layer(names: Iterable[str]) -> dict[str, list[str]]:
    """{layer key: sorted tensor names} over `names`, layer keys in order (`non_layer` last)."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(layer_of(name), []).append(name)
    return {k: groups[k] for k in sorted(groups, key=lambda k: (k == "non_layer", k))}


def _update(h: hashlib._Hash, t: torch.Tensor) -> None:
    h.update(str(tuple(t.shape)).encode())
    h.update(str(t.dtype).encode())
    if t.numel():  # flattened first: a 0-dim tensor (an optimizer's step) cannot be viewed as bytes
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)


def layer_hashes(named: dict[str, torch.Tensor]) -> dict[str, str]:
    """{"layer_0000": sha256, ..., "non_layer": sha256} over the given named tensors."""
    groups: dict[str, hashlib._Hash] = {}
    for name in sorted(named):
        h = groups.setdefault(layer_of(name), hashlib.sha256())
        h.update(name.encode())
        _update(h, named[name].detach().cpu().contiguous())
    return {k: groups[k].hexdigest() for k in sorted(groups)}


def tensor_hashes(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """{name: sha256 over the tensor's shape string, dtype string and raw bytes}, names sorted. Two sides that
    disagree on `weights_sha256` compare these to name the tensors that differ."""
    out = {}
    for name in sorted(named):
        h = hashlib.sha256()
        _update(h, named[name].detach().cpu().contiguous())
        out[name] = h.hexdigest()
    return out


def differing_tensors(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """Sorted names whose hash differs between two `tensor_hashes` maps, or that only one side has."""
    return sorted(n for n in set(expected) | set(actual) if expected.get(n) != actual.get(n))


class _Cast(Mapping[str, torch.Tensor]):
    """A read-only view of named tensors whose floating ones are cast to a dtype as each is read (one copy at a
    time: hashing a model's weights this way never holds a second copy of all of them)."""

    def __init__(self, named: Mapping[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.named, self.dtype = named, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.named[name].detach()
        return t.to(self.dtype) if t.is_floating_point() else t

    def __iter__(self) -> Iterator[str]:
        return iter(self.named)

    def __len__(self) -> int:
        return len(self.named)


def as_dtype(named: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> Mapping[str, torch.Tensor]:
    """`named` with its floating tensors cast to `dtype` as each is read (None: `named` itself): float32 weights as
    an engine that holds them in `dtype` has them, so the hashes of the two sides compare like with like."""
    return named if dtype is None else _Cast(named, dtype)


def weights_sha256(named: Mapping[str, torch.Tensor]) -> str:
    """One sha256 over all per-tensor hashes: the identity of a set of weights."""
    return weights_sha256_of(tensor_hashes(named))


def weights_sha256_of(hashes: dict[str, str]) -> str:
    """`weights_sha256` from the `tensor_hashes` of the weights (which can be computed bucket by bucket)."""
    return hashlib.sha256(repr(sorted(hashes.items())).encode()).hexdigest()
