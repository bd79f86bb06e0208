"""`rollflow diff RUN_A RUN_B`: the first divergence between two runs.

Walks the rollouts in id order and reports, for the first rollout that differs: its samples
(first column / sample), else its metrics (first metric; timing records excluded), else the
per-layer hashes of the checkpoint saved after it. Exit 0 only when everything compared is identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

from artifacts.compare import first_layer_difference, first_metric_difference, first_table_difference
from artifacts.hashing import layer_hashes
from artifacts.store import RunPaths, read_metrics, read_table
from flows.config import load_yaml

_TIMING_KINDS = {"perf"}  # wall-clock figures differ run to run by nature


def _rollout_ids(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "rollouts").glob("rollout_*.parquet"))


def _metrics_by_rollout(run: Path) -> dict[int, list[dict]]:
    """Every non-timing record of a run, grouped by rollout id (one read of metrics.jsonl)."""
    out: dict[int, list[dict]] = {}
    for r in read_metrics(RunPaths(run).metrics):
        if r["kind"] not in _TIMING_KINDS:
            out.setdefault(r["rollout_id"], []).append({"kind": r["kind"], "step": r.get("step"), **r["metrics"]})
    return out


def _checkpoint(run: Path, rollout_id: int) -> Path | None:
    save = load_yaml(run / "config.yaml").get("checkpoint", {}).get("save")
    path = Path(save) / f"iter_{rollout_id:07d}" / "model.safetensors" if save else None
    return path if path is not None and path.is_file() else None


def first_divergence(run_a: str | Path, run_b: str | Path) -> str | None:
    """One line naming the first difference between two run directories, or None."""
    from safetensors.torch import load_file

    a, b = Path(run_a), Path(run_b)
    ids_a, ids_b = _rollout_ids(a), _rollout_ids(b)
    if ids_a != ids_b:
        return f"rollout ids differ: {ids_a} vs {ids_b}"
    metrics_a, metrics_b = _metrics_by_rollout(a), _metrics_by_rollout(b)
    for rid in ids_a:
        paths_a, paths_b = RunPaths(a), RunPaths(b)
        diff = first_table_difference(read_table(paths_a.rollout(rid)), read_table(paths_b.rollout(rid)))
        if diff:
            return f"rollout {rid} samples: {diff}"
        diff = first_metric_difference(metrics_a.get(rid, []), metrics_b.get(rid, []))
        if diff:
            return f"rollout {rid} metrics: {diff}"
        ckpt_a, ckpt_b = _checkpoint(a, rid), _checkpoint(b, rid)
        if ckpt_a and ckpt_b:
            diff = first_layer_difference(layer_hashes(load_file(str(ckpt_a))), layer_hashes(load_file(str(ckpt_b))))
            if diff:
                return f"checkpoint iter_{rid:07d}: {diff}"
    return None


def diff_command(run_a: str, run_b: str) -> int:
    for run in (run_a, run_b):
        if not (Path(run) / "config.yaml").is_file():
            print(f"rollflow: error: {run} is not a run directory (no config.yaml)", file=sys.stderr)
            return 2
    diff = first_divergence(run_a, run_b)
    print("identical" if diff is None else f"first divergence: {diff}")
    return 0 if diff is None else 1
