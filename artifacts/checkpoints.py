"""Where checkpoints are on disk: `DIR/iter_{rollout_id:07d}/` plus `DIR/latest_checkpointed_iteration.txt`
(Megatron's and slime's layout), shared by every trainer backend and the orchestrator."""

from __future__ import annotations

import json
from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint to resume from in `directory`: itself if it is an iter_ dir, else the latest one
    recorded there; None when `directory` is missing or holds no checkpoint yet (slime's first launch with
    `--load D --save D`). A recorded checkpoint that is missing or incomplete is an error, not None."""
    d = Path(directory)
    if (d / "meta.json").is_file():
        return d
    latest = d / LATEST_FILE
    if not latest.is_file():
        if d.is_dir() and any(
            p.name.startswith("iter_") and (p / "meta.json").is_file() for p in d.iterdir()
        ):
            raise FileNotFoundError(f"--load {directory}: has iter_* checkpoints but no {LATEST_FILE}")
        return None
    text = latest.read_text().strip()
    if not text.isdigit():
        raise FileNotFoundError(
            f"--load {directory}: {LATEST_FILE} holds {text[:40]!r}, not an iteration number"
        )
    path = d / f"iter_{int(text):07d}"
    if not (path / "meta.json").is_file():
        raise FileNotFoundError(f"--load {directory}: {path} is missing or incomplete")
    return path


# files a checkpoint never holds empty (a backend's other files, e.g. a sharded format's, are not judged)
_NEVER_EMPTY = (".json", ".safetensors", ".pt")


def damage(path: str | Path) -> str | None:
    """What is visibly damaged in the checkpoint dir `path`, as a machine crash leaves files that had not reached
    the disk (empty, or cut short); None if nothing is. Reads headers only: meta.json holds a rollout id, every
    JSON file parses, every safetensors file holds the bytes its header declares (`artifacts.lint`), and none of
    these (nor a .pt file) is empty. A file that is whole but wrong is not detected: `--save` checkpoints are
    flushed to the disk before they are named, and --ci-check-model-hash compares their weights."""
    from artifacts.lint import read_safetensors_header

    root = Path(path)
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except FileNotFoundError:
        return "no meta.json"
    except ValueError:  # empty, cut short or garbled
        return "meta.json is not JSON"
    if not isinstance(meta, dict) or not isinstance(meta.get("rollout_id"), int):
        return "meta.json holds no rollout id"
    for file in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _NEVER_EMPTY):
        name = file.relative_to(root)
        if file.stat().st_size == 0:
            return f"{name} is empty"
        if file.suffix == ".json":
            try:
                json.loads(file.read_bytes())
            except ValueError:
                return f"{name} is not JSON"
        elif file.suffix == ".safetensors" and (problems := read_safetensors_header(file)[1]):
            return f"{name}: {problems[0]}"
    return None


def resolve_checkpoint(directory: str | Path) -> Path:
    """`latest_checkpoint`, but a directory without a checkpoint is an error."""
    path = latest_checkpoint(directory)
    if path is None:
        raise FileNotFoundError(f"--load {directory}: no {LATEST_FILE} and not a checkpoint directory")
    return path


def model_dir(path: str | Path) -> Path:
    """An HF model dir for `path`: an HF dir as is, or the latest checkpoint of a --save dir (whose iter_
    dirs hold config.json + model.safetensors, loadable with from_pretrained)."""
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    ckpt = latest_checkpoint(p)
    if ckpt is None or not (ckpt / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: neither an HF model dir (config.json) nor a directory of checkpoints"
        )
    return ckpt
