"""`rollflow diff RUN_A RUN_B`: the first divergence between two runs.

First everything both runs have, in rollout id order. For each rollout both recorded: its samples (first
column / sample), else the metric records both logged for it (matched by kind and step; timing records
excluded), else the per-layer hashes of the checkpoint saved after it. Only when all of that is identical does
it report what one run has and the other lacks (rollouts, steps, records). So a run that stopped early at a
checker is compared on the rollouts it did finish, and the report names the first differing column rather than
"rollout ids differ". Exit 0 only when everything is identical.

Bookkeeping is set aside, and the report says so. The check records are about checking the run, not about
training it. Which checks run depends on flags and on where a process started (--ci-test, the first sync of a
run but not of a resume). So a check that only one run recorded is no divergence. Checks both runs recorded
are compared by name. A metric of training (`rollout/*`, `train/*`, `eval/*`) that only one run logged stays a
divergence.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from artifacts.compare import first_layer_difference, first_metric_difference, first_table_difference
from artifacts.hashing import layer_hashes
from artifacts.schema import table_to_samples
from artifacts.store import ArtifactError, RunPaths, read_metrics, read_table
from config import load_yaml
from config.location import relocate

_TIMING_KINDS = {"perf"}  # wall-clock figures differ run to run by nature
_BOOKKEEPING_KINDS = {"check"}  # records about checking the run (see the module docstring)

# (kind, step for step records / position among the rollout's records of that kind)
RecordKey = tuple[str, int]
ByRollout = dict[int, dict[RecordKey, dict[str, Any]]]  # a run's records: rollout id -> record key -> record


def _rollout_ids(run: Path) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in (run / "rollouts").glob("rollout_*.parquet"))


def _metrics_by_rollout(run: Path) -> ByRollout:
    """Every non-timing record of a run, by rollout id, from one read of metrics.jsonl. Step records are keyed
    by (kind, step), others by (kind, n-th record of that kind). So two runs are compared record by record
    even when one of them logged fewer. A rollout's bookkeeping records are merged into one, (kind, 0),
    compared by metric name (`_bookkeeping`)."""
    out: ByRollout = {}
    for r in read_metrics(RunPaths(run).metrics, strict=True):
        if r["kind"] in _TIMING_KINDS:
            continue
        records = out.setdefault(r["rollout_id"], {})
        if r["kind"] in _BOOKKEEPING_KINDS:
            records.setdefault((r["kind"], 0), {"kind": r["kind"], "step": None}).update(r["metrics"])
            continue
        if r["kind"] == "step" and r.get("step") is not None:
            key = ("step", int(r["step"]))
        else:
            key = (r["kind"], sum(1 for kind, _ in records if kind == r["kind"]))
        records[key] = {"kind": r["kind"], "step": r.get("step"), **r["metrics"]}
    return out


def _rollout_table(path: Path) -> pa.Table:
    """The rollout artifact at `path`, checked as a rollout (columns and types: `ArtifactError` naming the file
    and the column), so that a damaged file is reported as such rather than as a difference."""
    table = read_table(path)
    try:
        table_to_samples(table)
    except ValueError as e:
        raise ArtifactError(f"{path}: {e}") from None
    return table


def _checkpoint(run: Path, rollout_id: int) -> Path | None:
    # a moved or copied run's checkpoints under its run dir are read where they are now
    save = relocate(load_yaml(run / "config.yaml"), run).get("checkpoint", {}).get("save")
    path = Path(save) / f"iter_{rollout_id:07d}" / "model.safetensors" if save else None
    return path if path is not None and path.is_file() else None


def _describe_key(key: RecordKey) -> str:
    kind, n = key
    return f"step {n}" if kind == "step" else f"{kind} record {n}"


def _ranges(ids: list[int]) -> str:
    """`0-2, 5` for [0, 1, 2, 5]."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


# The order in which a rollout's records were written: eval N (of the weights rollout N starts from), the
# rollout's stats, its optimizer steps, its checks. The first difference in this order is the earliest one.
_KIND_ORDER = {"eval": 0, "rollout": 1, "step": 2, "check": 3}


def _in_log_order(keys: set[RecordKey]) -> list[RecordKey]:
    return sorted(keys, key=lambda k: (_KIND_ORDER.get(k[0], len(_KIND_ORDER)), k))


def _bookkeeping(
    rec_a: dict[str, Any] | None, rec_b: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metrics of a bookkeeping record that both runs logged, as two records to compare."""
    a, b = rec_a or {}, rec_b or {}
    common = a.keys() & b.keys()
    return {k: a[k] for k in common}, {k: b[k] for k in common}


def _set_aside(names: tuple[str, str], metrics: tuple[ByRollout, ByRollout]) -> list[str]:
    """The bookkeeping metrics only one run logged, over the rollouts both logged records for:
    `'check/weight_update_equal' only in RUN (rollout 0)`, one line per metric and run."""
    where: dict[tuple[str, int], list[int]] = {}
    for rid in sorted(set(metrics[0]) & set(metrics[1])):
        recs = metrics[0][rid], metrics[1][rid]
        for key in {k for r in recs for k in r if k[0] in _BOOKKEEPING_KINDS}:
            mine = [set(r.get(key, {})) - {"kind", "step"} for r in recs]
            for has in (0, 1):
                for metric in mine[has] - mine[1 - has]:
                    where.setdefault((metric, has), []).append(rid)
    return [
        f"{metric!r} only in {names[has]} (rollout{'s' if len(ids) > 1 else ''} {_ranges(ids)})"
        for (metric, has), ids in sorted(where.items())
    ]


def _common_difference(
    a: Path, b: Path, rollouts: list[int], metrics_a: ByRollout, metrics_b: ByRollout
) -> str | None:
    """The first difference in what both runs have: rollouts both recorded, then records both logged (the
    bookkeeping records by the metrics both have)."""
    from safetensors.torch import load_file

    paths_a, paths_b = RunPaths(a), RunPaths(b)
    for rid in sorted(set(rollouts) | (set(metrics_a) & set(metrics_b))):
        if rid in rollouts:
            diff = first_table_difference(
                _rollout_table(paths_a.rollout(rid)), _rollout_table(paths_b.rollout(rid))
            )
            if diff:
                return f"rollout {rid} samples: {diff}"
        recs_a, recs_b = metrics_a.get(rid, {}), metrics_b.get(rid, {})
        for key in _in_log_order(set(recs_a) | set(recs_b)):
            if key[0] in _BOOKKEEPING_KINDS:
                rec_a, rec_b = _bookkeeping(recs_a.get(key), recs_b.get(key))
            elif key in recs_a and key in recs_b:
                rec_a, rec_b = recs_a[key], recs_b[key]
            else:  # reported by `_first_lacking` once everything both have is identical
                continue
            diff = first_metric_difference([rec_a], [rec_b], (str(a), str(b)))
            if diff:
                return f"rollout {rid} metrics: {_describe_key(key)}: {diff.removeprefix('record 0: ')}"
        ckpt_a, ckpt_b = _checkpoint(a, rid), _checkpoint(b, rid)
        if ckpt_a and ckpt_b:
            diff = first_layer_difference(
                layer_hashes(load_file(str(ckpt_a))), layer_hashes(load_file(str(ckpt_b)))
            )
            if diff:
                return f"checkpoint iter_{rid:07d}: {diff}"
    return None


def _first_lacking(
    names: tuple[str, str], ids: tuple[list[int], list[int]], metrics: tuple[ByRollout, ByRollout]
) -> str | None:
    """What one run has and the other lacks, the earliest rollout first: a rollout recording (then every
    rollout one run lacks is listed), else a record of a rollout both logged."""
    only = [sorted(set(ids[0]) - set(ids[1])), sorted(set(ids[1]) - set(ids[0]))]
    for rid in sorted(set(ids[0]) | set(ids[1]) | set(metrics[0]) | set(metrics[1])):
        if rid in only[0] or rid in only[1]:
            common = sorted(set(ids[0]) & set(ids[1]))
            notes = [
                f"{names[1 - i]} lacks rollout(s) {_ranges(only[i])} that {names[i]} has"
                for i in (0, 1)
                if only[i]
            ]
            same = f"rollouts {_ranges(common)} are identical in both" if common else "no rollout in common"
            return (
                f"{same}; "
                + "; ".join(notes)
                + " (stopped early: a checker, a crash or --debug-exit-after-rollout?)"
            )
        recs_a, recs_b = metrics[0].get(rid, {}), metrics[1].get(rid, {})
        for key in _in_log_order(set(recs_a) ^ set(recs_b)):
            if key[0] in _BOOKKEEPING_KINDS:  # set aside by `_common_difference`
                continue
            has, lacks = (names[0], names[1]) if key in recs_a else (names[1], names[0])
            return f"rollout {rid} metrics: {_describe_key(key)} only in {has}; {lacks} lacks it"
    return None


@dataclass(frozen=True)
class Comparison:
    """Two runs compared: the first divergence (None when identical) and the bookkeeping set aside on the way
    (`'check/x' only in RUN (rollouts 0-2)` lines)."""

    divergence: str | None
    set_aside: list[str]


def compare_runs(run_a: str | Path, run_b: str | Path) -> Comparison:
    """The first divergence between two run directories and the bookkeeping set aside to find it.

    What both runs have is compared first (see the module docstring); only then what one lacks. The set-aside
    list covers every rollout both runs logged records for."""
    a, b = Path(run_a), Path(run_b)
    ids_a, ids_b = _rollout_ids(a), _rollout_ids(b)
    metrics_a, metrics_b = _metrics_by_rollout(a), _metrics_by_rollout(b)
    common = sorted(set(ids_a) & set(ids_b))
    names = (str(run_a), str(run_b))
    divergence = _common_difference(a, b, common, metrics_a, metrics_b) or _first_lacking(
        names, (ids_a, ids_b), (metrics_a, metrics_b)
    )
    return Comparison(divergence, _set_aside(names, (metrics_a, metrics_b)))


def first_divergence(run_a: str | Path, run_b: str | Path) -> str | None:
    """One line naming the first difference between two run directories, or None when identical (bookkeeping
    set aside: `compare_runs`)."""
    return compare_runs(run_a, run_b).divergence


def lacking_rollouts(run_a: str | Path, run_b: str | Path) -> str | None:
    """A note on the rollouts only one of the runs recorded (None when both recorded the same ids), printed
    after a difference found in the rollouts both have."""
    ids_a, ids_b = _rollout_ids(Path(run_a)), _rollout_ids(Path(run_b))
    notes = [
        f"{other} lacks rollout(s) {_ranges(sorted(set(mine) - set(theirs)))}"
        for mine, theirs, other in ((ids_a, ids_b, str(run_b)), (ids_b, ids_a, str(run_a)))
        if set(mine) - set(theirs)
    ]
    return "; ".join(notes) or None


def diff_command(run_a: str, run_b: str) -> int:
    """Print the first divergence (or `identical`); exit 0 when identical, 1 when not, 2 for a bad run dir."""
    for run in (run_a, run_b):
        if not (Path(run) / "config.yaml").is_file():
            print(f"rollflow: error: {run} is not a run directory (no config.yaml)", file=sys.stderr)
            return 2
        if not (Path(run) / "metrics.jsonl").is_file():
            print(f"rollflow: error: {run} has no metrics.jsonl (did the run start?)", file=sys.stderr)
            return 2
    try:
        comparison = compare_runs(run_a, run_b)
    except (
        ArtifactError,
        ValueError,
        OSError,
    ) as e:  # a corrupt artifact or config.yaml: each names its file
        print(f"rollflow: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    diff = comparison.divergence
    aside = (
        [f"set aside (bookkeeping, not training): {'; '.join(comparison.set_aside)}"]
        if comparison.set_aside
        else []
    )
    if diff is None:
        print("\n".join(["identical", *aside]))
        return 0
    print(f"first divergence: {diff}")
    note = lacking_rollouts(run_a, run_b)
    if note and "lacks rollout" not in diff:
        print(f"also: {note}")
    for line in aside:
        print(line)
    return 1
