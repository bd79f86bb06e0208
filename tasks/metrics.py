"""Metric records: one line in metrics.jsonl, one slime-style log line (`rollout N: {...}`, to the Prefect run's
log: `tasks/notify.py`), the record to in-process listeners (console, run report), and the same record to the
run's experiment trackers (W&B, TensorBoard; `tasks/trackers.py`)."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

from artifacts.schema import Sample
from artifacts.store import RunPaths, append_metrics
from config import RunConfig
from tasks.notify import publish_record, say
from tasks.trackers import finish_trackers, track
from trainers.rollout_stats import mean as _mean

# run dir -> the id of the run that owns it in this process (flows/runtime.own sets it)
_RUN_IDS: dict[str, str] = {}


def set_run_id(cfg: RunConfig, run_id: str) -> None:
    """Tag every record this process logs for `cfg`'s run dir with `run_id`."""
    _RUN_IDS[str(cfg.resolved_run_dir)] = run_id


def run_id_of(cfg: RunConfig) -> str | None:
    """The id of the run that owns `cfg`'s run dir in this process, if one does."""
    return _RUN_IDS.get(str(cfg.resolved_run_dir))


def log_metrics(
    cfg: RunConfig,
    kind: str,
    rollout_id: int,
    metrics: dict[str, Any],
    step: int | None = None,
    *,
    sync: bool = False,
) -> dict[str, Any]:
    """Append `{"kind", "run_id"?, "rollout_id", "step"?, "metrics"}` to metrics.jsonl and log it as slime
    prints it (`rollout N: {...}`). Then hand it to the in-process listeners, and to the trackers the config
    turns on. A tracker's failure raises `TrackerError`, after the record is written.

    `sync` fsyncs metrics.jsonl after the record (and so every record before it). The parent's records that mark
    a point a resume starts from (a rollout's `perf/step_time`, the end-of-run gate) sync. A stage's records need
    not, sparing an fsync each: should the machine lose them, their rollout has no mark and a resume runs it
    again."""
    record: dict[str, Any] = {"kind": kind}
    run_id = run_id_of(cfg)
    if run_id is not None:
        record["run_id"] = run_id
    record["rollout_id"] = rollout_id
    if step is not None:
        record["step"] = step
    record["metrics"] = metrics
    append_metrics(RunPaths(cfg.resolved_run_dir).metrics, record, sync=sync)
    say(f"{kind} {step if kind == 'step' else rollout_id}: {metrics}")
    publish_record(cfg.resolved_run_dir, record)
    track(cfg, kind, rollout_id, metrics, step)
    return record


def close_run(cfg: RunConfig) -> Path | None:
    """End of a run, also of a failed one: finish its trackers (their files complete on disk), then draw the
    run's curves into `<run dir>/plots/curves.png`. Returns the plot's path, or None when there was nothing
    to draw or drawing failed. This runs in the run's `finally`, so neither a tracker nor the plot changes the
    run's outcome here (both report on stderr)."""
    finish_trackers(cfg)
    run_dir = cfg.resolved_run_dir
    if not RunPaths(run_dir).metrics.is_file():
        return None
    from artifacts.plots import write_plot

    try:
        return write_plot([run_dir], run_dir / "plots" / "curves.png", labels=[cfg.name])
    except Exception as e:  # a plot is a convenience; the run's result stands without it
        print(
            f"rollflow: could not draw {run_dir / 'plots' / 'curves.png'}: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        return None


def reward_stats(samples: list[Sample], n_per_prompt: int) -> dict[str, float]:
    """Rollout-side stats of one rollout, with slime's names: reward, lengths, truncation, failed rewards and
    zero-std groups. `rollout/failed_count` counts samples whose reward raised.
    `rollout/zero_std/count_{reward}` counts groups whose valid samples all got that reward, rounded to 0.1. A
    failed sample is out of its group's statistics, as in the trainer's advantages."""
    lengths = [float(s.response_length) for s in samples]
    groups: dict[int, list[float]] = {}
    for s in samples:
        if s.status != "failed":
            groups.setdefault(s.group_index, []).append(s.reward)
    zero_std: dict[str, float] = {}
    for rewards in groups.values():
        if len(set(rewards)) == 1:
            key = f"rollout/zero_std/count_{round(rewards[0], 1)}"
            zero_std[key] = zero_std.get(key, 0.0) + 1.0
    return {
        "rollout/raw_reward": _mean([s.reward for s in samples]),
        "rollout/response_lengths": _mean(lengths),
        "rollout/truncated_ratio": _mean([1.0 if s.status == "truncated" else 0.0 for s in samples]),
        "rollout/failed_ratio": _mean([1.0 if s.status == "failed" else 0.0 for s in samples]),
        "rollout/failed_count": float(sum(s.status == "failed" for s in samples)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/response_len/median": float(statistics.median(lengths)),
        **dict(sorted(zero_std.items())),
    }


def eval_stats(samples: list[Sample], names: list[str]) -> dict[str, float]:
    """Per eval dataset (a sample's metadata names it): `eval/NAME` = mean reward and
    `eval/NAME-truncated_ratio`, slime's names."""
    out: dict[str, float] = {}
    for name in names:
        mine = [s for s in samples if s.metadata.get("eval_dataset") == name]
        out[f"eval/{name}"] = _mean([s.reward for s in mine])
        out[f"eval/{name}-truncated_ratio"] = _mean([1.0 if s.status == "truncated" else 0.0 for s in mine])
    return out


def non_finite(metrics: dict[str, Any]) -> list[str]:
    """Names of the metrics that are NaN or infinite."""
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
