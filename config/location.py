"""Where a run is: the run dir a command was pointed at, not the one its config.yaml recorded. A run dir that was
moved or copied keeps its old absolute `run_dir` (and the paths that lay inside it) in config.yaml; `relocate`
reads that config for the dir it is in now."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

# (section, field; "" = top level) of every path or path template in a run's config
PATH_FIELDS = (
    ("", "hf_checkpoint"),
    ("", "ref_load"),
    ("data", "prompt_data"),
    ("checkpoint", "save"),
    ("checkpoint", "load"),
    ("debug", "save_debug_rollout_data"),
    ("debug", "load_debug_rollout_data"),
    ("debug", "dump_details"),
    ("debug", "save_debug_train_data"),
    ("debug", "ci_inject_rollout_data_path"),
    ("debug", "load_forge_rollout_data"),
    ("ci", "ci_save_grad_norm"),
    ("ci", "ci_load_grad_norm"),
    ("faults", "ci_fault_hooks_path"),
    ("logging", "wandb_dir"),
)

# the path fields a run writes to (outside its run dir when they point there); the trackers' dirs aside
OUTPUT_FIELDS = (
    ("checkpoint", "save"),
    ("debug", "save_debug_rollout_data"),
    ("debug", "dump_details"),
    ("debug", "save_debug_train_data"),
    ("ci", "ci_save_grad_norm"),
)


def recorded_run_dir(data: dict[str, Any]) -> Path:
    """The run dir a config (config.yaml's mapping) names: its `run_dir`, else runs/<name>, resolved against the
    current directory as `RunConfig.resolved_run_dir` resolves it."""
    from config.run import RunConfig

    name = data.get("name") or RunConfig.model_fields["name"].default
    return _absolute(str(data.get("run_dir") or f"runs/{name}"))


def relocate(data: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """A copy of `data` (a run's config.yaml) for the run now in `run_dir`: `run_dir` set to it (absolute), and
    every path field (`PATH_FIELDS`, and the eval data paths) that lay inside the recorded run dir moved with it
    to the same place under `run_dir`. Paths outside the recorded run dir are left as they are."""
    new = _absolute(str(run_dir))
    out = copy.deepcopy(data)
    out["run_dir"] = str(new)
    try:
        old = recorded_run_dir(data)
    except ValueError:  # not a path at all (a NUL byte): nothing can lie inside it
        return out
    if new == old:
        return out
    for section, name in PATH_FIELDS:
        holder = out.get(section) if section else out
        if isinstance(holder, dict) and isinstance(holder.get(name), str):
            holder[name] = _moved(holder[name], old, new)
    data_section = out.get("data")
    evals = data_section.get("eval_prompt_data") if isinstance(data_section, dict) else None
    if isinstance(evals, list):  # NAME PATH pairs
        for i in range(1, len(evals), 2):
            if isinstance(evals[i], str):
                evals[i] = _moved(evals[i], old, new)
    return out


def inside(path: str, run_dir: Path) -> bool:
    """Whether `path` (a path or a path template) lies in `run_dir` (an absolute, resolved path); False for what
    is no path at all (a NUL byte)."""
    try:
        return _absolute(path).is_relative_to(run_dir)
    except ValueError:
        return False


def _moved(path: str, old: Path, new: Path) -> str:
    try:
        absolute = _absolute(path)
    except ValueError:  # a NUL byte: left for the config's own checks to refuse
        return path
    return str(new / absolute.relative_to(old)) if absolute.is_relative_to(old) else path


def _absolute(path: str) -> Path:
    # resolved without requiring the path to exist: a moved run's old dir is gone
    return (Path(os.getcwd()) / path).resolve()
