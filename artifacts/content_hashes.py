"""Content hashes of a `--save` checkpoint, so that `--load` and `lint-ckpt` find a changed byte and name its tensor.

`iter_N/tensor_hashes.json` (written atomically by the save, before the checkpoint is published):
    {"version": 1, "files": {FILE: {"tensors": {NAME: SHA256}} | {"ranges": {KEY: [OFFSET, LENGTH, SHA256]}}}}
- `tensors`, for a safetensors file: `artifacts.hashing.tensor_hashes` of the tensors as saved (SHA-256 over shape,
  dtype and raw bytes), so the hashes of `model.safetensors` are also the weights' identity (`weights_sha256_of`);
- `ranges`, for the other files a load reads (a Megatron checkpoint's `*.distcp` shards, one range per stored
  item, keyed by its sharded key and offset): SHA-256 of the bytes at [OFFSET, OFFSET + LENGTH) of the file.
A checkpoint saved before these hashes existed has no such file: it is reported as unverified, not as damaged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from artifacts.atomic import atomic_write_json
from artifacts.hashing import tensor_hashes

HASHES_FILE = "tensor_hashes.json"
VERSION = 1
_PREFIX = 12  # hex digits of a hash shown in a message
_CHUNK = 1 << 24


def record(
    directory: str | Path,
    tensors: Mapping[str, Mapping[str, torch.Tensor]],
    ranges: dict[str, dict[str, tuple[int, int]]] | None = None,
) -> None:
    """Write `directory`/tensor_hashes.json.
    - `tensors` (file -> name -> tensor): per-tensor hashes of each safetensors file's tensors as saved.
    - `ranges` (file -> key -> (offset, length)): a hash of each byte range of the other files, read from the
      files already in `directory`."""
    root = Path(directory)
    files: dict[str, Any] = {f: {"tensors": tensor_hashes(named)} for f, named in tensors.items()}
    for f, spans in (ranges or {}).items():
        with open(root / f, "rb") as fh:
            files[f] = {"ranges": {k: [o, n, _hash_range(fh, o, n)] for k, (o, n) in sorted(spans.items())}}
    atomic_write_json(root / HASHES_FILE, {"version": VERSION, "files": files})


def saved(directory: str | Path) -> dict[str, Any] | None:
    """The `files` of `directory`/tensor_hashes.json; None when the checkpoint has none (saved before them).
    A file that is not one this version wrote raises ValueError naming it."""
    path = Path(directory) / HASHES_FILE
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("files"), dict):
        raise ValueError(f"{path}: not a version {VERSION} tensor hash file")
    return doc["files"]


def mismatch(file: str, expected: dict[str, str], tensors: dict[str, torch.Tensor]) -> str | None:
    """The first tensor of `file` whose content differs from its saved hash, in one line: tensor name, saved
    and computed hash prefixes. A tensor saved but not read, or read but not saved, is named too."""
    got = tensor_hashes(tensors)
    for name in sorted(set(expected) | set(got)):
        want, have = expected.get(name), got.get(name)
        if want != have:
            return f"{file}: tensor {name}: {_show(want, 'saved')}, {_show(have, 'read')}"
    return None


def verify_loaded(path: Path, file: str, tensors: dict[str, torch.Tensor]) -> str | None:
    """Check what a load read from `path`/`file` against the hashes its save recorded. Returns the problem in
    one line (`mismatch`), or None when it matches or nothing was recorded for the file (see `saved` for the
    checkpoint)."""
    files = saved(path)
    entry = (files or {}).get(file)
    if not entry or "tensors" not in entry:
        return None
    return mismatch(file, entry["tensors"], tensors)


def verify(directory: str | Path, only: tuple[str, ...] | None = None) -> list[tuple[str, str]] | None:
    """Re-hash every file `directory`/tensor_hashes.json names (or those of them in `only`), reading it from disk:
    (file, problem) pairs, one per tensor or range that differs from its saved hash (none when all match); None
    when the checkpoint has no hashes."""
    from safetensors import safe_open

    root = Path(directory)
    try:
        files = saved(root)
    except ValueError as e:
        return [(HASHES_FILE, str(e).split(": ", 1)[1])]
    if files is None:
        return None
    problems: list[tuple[str, str]] = []
    for name, entry in sorted(files.items()):
        if only is not None and name not in only:
            continue
        path = root / name
        if not path.is_file():
            problems.append((name, f"missing ({HASHES_FILE} holds its hashes)"))
        elif "tensors" in entry:
            expected, got = entry["tensors"], {}
            try:
                with safe_open(str(path), framework="pt") as fh:
                    for t in fh.keys():  # noqa: SIM118 (not a dict); one tensor in memory at a time
                        got.update(tensor_hashes({t: fh.get_tensor(t)}))
            except Exception as e:  # noqa: BLE001 (an unreadable file is one problem, whatever safetensors raises)
                problems.append((name, f"unreadable ({e})"))
                continue
            problems += [
                (name, f"tensor {t}: {_show(expected.get(t), 'saved')}, {_show(got.get(t), 'read')}")
                for t in sorted(set(expected) | set(got))
                if expected.get(t) != got.get(t)
            ]
        else:
            with open(path, "rb") as fh:
                for key, (offset, length, want) in entry["ranges"].items():
                    have = _hash_range(fh, offset, length)
                    if have != want:
                        problems.append((name, f"item {key}: {_show(want, 'saved')}, {_show(have, 'read')}"))
    return problems


# what a --load that finds a changed tensor says after naming it
CHANGED = "the file changed after its save; --no-verify-checkpoint loads it anyway"


def unverified_notice(path: str | Path) -> str:
    """The one line said for a checkpoint without content hashes."""
    return f"{path}: saved without content hashes ({HASHES_FILE}), so its tensors are not verified"


def _show(digest: str | None, side: str) -> str:
    return f"{side} sha256 {digest[:_PREFIX]}" if digest else f"not {side}"


def _hash_range(fh: Any, offset: int, length: int) -> str:
    h = hashlib.sha256()
    fh.seek(offset)
    left = length
    while left > 0:
        chunk = fh.read(min(left, _CHUNK))
        if not chunk:
            break  # cut short: the digest differs from the saved one
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()
