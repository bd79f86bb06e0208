"""Cache keys built from refs' sha256 + the task's config slice + code version.

Re-running a rollout flow with the same inputs returns the cached stages; a stage is forced with
`refresh_cache=True` (the `--refresh` flag of `rollflow run`/`replay`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from pydantic import BaseModel

_PACKAGES = ("artifacts", "config", "engines", "faults", "flows", "recipes", "rollout", "tasks", "trainers")


@cache
def code_version() -> str:
    """sha256 over the source of every rollflow package: any code change invalidates the cache."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, BaseModel):
        data = value.model_dump(mode="json")
        # a ref is identified by its content hash, not by where the file happens to be
        return {"sha256": data["sha256"]} if "sha256" in data else data
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    return value


@dataclass
class RefCachePolicy(CachePolicy):
    """Key = task name + canonical inputs (refs by sha256) + the config slice `sections` + code version.

    The `cfg` input contributes only the named sections of `RunConfig` plus where the run lives
    (run dir, run id, base checkpoint, thread count), so changing e.g. the learning rate does not
    invalidate cached generations, and a stage is reused only within the run that computed it.
    """

    sections: tuple[str, ...] = ()

    def compute_key(
        self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        inputs = dict(inputs)
        cfg = inputs.pop("cfg", None)
        if cfg is not None:
            from tasks.metrics import run_id_of

            # scoped to one run (its resumes and retries included): a new run logs every record itself,
            # where a stage from another run's cache would return without logging
            inputs["cfg"] = {
                "slice": cfg.section_hash(*self.sections),
                "run_dir": str(cfg.resolved_run_dir),
                "hf_checkpoint": cfg.hf_checkpoint,
                "num_threads": cfg.num_threads,
                "run_id": run_id_of(cfg),
            }
        payload = {"task": task_ctx.task.name, "code": code_version(), "inputs": _canonical(inputs)}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
