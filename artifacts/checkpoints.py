"""Where checkpoints are on disk: `DIR/iter_{rollout_id:07d}/` plus `DIR/latest_checkpointed_iteration.txt`
(Megatron's and slime's layout), shared by every trainer backend and the orchestrator."""

from __future__ import annotations

import json
import re
import shutil
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
    these (nor a .pt file) is empty. A file that is whole but wrong is not detected here: `--save` checkpoints are
    flushed to the disk before they are named, and the trainer's load checks their tensors against the content
    hashes their save recorded (artifacts/content_hashes.py)."""
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


# What a load of each format reads (trainers/torch_trainer `load`, trainers/megatron/persistence.py), besides the
# distributed shards (`*.distcp`) of a Megatron checkpoint.
_TORCH_FORMAT = {
    "meta.json": "step and rollout id",
    "model.safetensors": "the weights",
    "optimizer.safetensors": "the optimizer state",
    "scheduler.json": "the LR schedule",
    "rng.safetensors": "the RNG state",
}
_MEGATRON_FORMAT = {
    "meta.json": "step and rollout id",
    "metadata.json": "the distributed checkpoint's format",
    "common.pt": "step, schedule and optimizer flags",
    ".metadata": "the index of the distributed shards",
}
_CHECKPOINT_NAME = re.compile(r"iter_\d+")
_UNFINISHED_NAME = re.compile(r"iter_\d+\.tmp-.+")


def is_checkpoint_name(path: Path) -> bool:
    """Whether `path` is named as a published checkpoint (`iter_N`), not an unfinished save."""
    return _CHECKPOINT_NAME.fullmatch(path.name) is not None


def unfinished_saves(directory: str | Path) -> list[Path]:
    """The `iter_N.tmp-*` dirs in `directory`: saves that died before their rename published them."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_dir() and _UNFINISHED_NAME.fullmatch(p.name))


def remove_unfinished_saves(directory: str | Path) -> list[Path]:
    """Delete `unfinished_saves(directory)` and return them. Only a run that owns `directory` calls this, as it
    starts: a save in progress there can only be its own, which has not begun."""
    removed = unfinished_saves(directory)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def load_problems(path: str | Path) -> list[tuple[str, str]]:
    """What a load of the checkpoint dir `path` would fail on, as (file, problem) pairs; none when it would
    not. A problem is a file its format's load reads that is missing, empty, not JSON or not a readable
    safetensors file. Those files are meta.json (with an integer rollout id and step); the model, optimizer,
    scheduler and RNG of the torch format; the metadata, common.pt and shards of a Megatron distributed
    checkpoint. Reads headers only."""
    from artifacts.lint import read_safetensors_header

    root = Path(path)
    try:
        meta = json.loads((root / "meta.json").read_bytes())
    except (OSError, ValueError):
        meta = None
    megatron = (isinstance(meta, dict) and meta.get("format") == "megatron") or (
        root / "metadata.json"
    ).is_file()
    problems: list[tuple[str, str]] = []
    for name, holds in (_MEGATRON_FORMAT if megatron else _TORCH_FORMAT).items():
        file = root / name
        if not file.is_file():
            problems.append((name, f"missing (a load reads {holds} from it)"))
        elif file.stat().st_size == 0:
            problems.append((name, "empty"))
        elif file.suffix == ".json" and not _is_json(file):
            problems.append((name, "not JSON"))
        elif file.suffix == ".safetensors" and (bad := read_safetensors_header(file)[1]):
            problems.append((name, bad[0]))
    if megatron and not any(root.glob("*.distcp")):
        problems.append(("*.distcp", "missing (a load reads the weights and optimizer state from them)"))
    if isinstance(meta, dict):
        for key in ("rollout_id", "global_step"):
            if type(meta.get(key)) is not int:
                problems.append(("meta.json", f"holds no integer {key}"))
    elif meta is not None:
        problems.append(("meta.json", "not a JSON object"))
    return problems


def _is_json(file: Path) -> bool:
    try:
        json.loads(file.read_bytes())
    except ValueError:
        return False
    return True
