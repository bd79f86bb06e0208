"""What a run has done so far, for the console and the Prefect UI: its metric records, the rollouts' wall
times, the evals, the checks, and how the run ended. Records an earlier process of the same run wrote are read
once from metrics.jsonl; each new one arrives from `log_metrics` through `tasks.notify`.

Bookkeeping only: apart from that first read it does no I/O, so the console and the UI artifacts can ask it
for their numbers after every rollout at no cost. Observers (the console of `rollflow run`, a benchmark) register
with `observe` and are told when the run starts, after each rollout and when it ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from artifacts.rundir import logged_by
from artifacts.store import RunPaths, read_metrics
from config import RunConfig

Status = Literal["running", "completed", "stopped", "cancelled", "failed"]

# check metrics whose value 1 means the check passed (check/violations counts failures instead;
# check/weight_version is a record, not a check)
PASS_IS_ONE = (
    "check/finite_metrics",
    "check/engines_in_sync",
    "check/weight_update_equal",
    "check/metric_gate",
    "check/log_prob_deterministic",
    "check/train_step_deterministic",
    "check/generate_deterministic",
)
ETA_WINDOW = 20  # rollouts the ETA averages over: at least two eval intervals of the default run


@dataclass(frozen=True)
class RolloutStats:
    """One rollout in numbers; None where the run did not log the metric. The reward; the mean over its
    optimizer steps of KL and grad norm; entropy and response length; its wall seconds; and the evals its flow
    ran, as (weights version, {eval/NAME: value})."""

    rollout_id: int
    reward: float | None
    kl: float | None
    entropy: float | None
    grad_norm: float | None
    length: float | None
    seconds: float | None
    evals: list[tuple[int, dict[str, float]]]


@dataclass(frozen=True)
class CheckCount:
    """How often one check metric passed, and the rollouts where it failed."""

    name: str
    passed: int
    failed_at: list[int]


@dataclass
class RunReport:
    """The run's state as its parent flow sees it. `start` is the first rollout this process runs (after a
    resume: where it resumed), `end` the rollout it stops before; `records` are the run's metric records."""

    cfg: RunConfig
    run_id: str
    start: int
    end: int
    records: list[dict[str, Any]] = field(default_factory=list)
    status: Status = "running"
    failure: str | None = None  # the root cause line of a failed run
    findings: list[Any] | None = None  # flows.doctor Findings, when the doctor ran at the end
    doctor_error: str | None = None  # why the doctor could not read the run
    clock: Callable[[], float] = time.monotonic
    began: float = 0.0
    ended: float | None = None
    seconds: dict[int, float] = field(default_factory=dict)  # rollout id -> wall seconds (this process)

    def __post_init__(self) -> None:
        self.began = self.clock()

    @classmethod
    def load(cls, cfg: RunConfig, run_id: str, start: int, end: int) -> RunReport:
        """The report of the run `run_id` in `cfg`'s run dir, with the records earlier processes wrote."""
        path = RunPaths(cfg.resolved_run_dir).metrics
        records = read_metrics(path, run_id=run_id) if path.is_file() else []
        return cls(cfg, run_id, start, end, records)

    # -- tasks.notify.Listener ------------------------------------------------------------------------
    def on_record(self, run_dir: Path, record: dict[str, Any]) -> None:
        """Keep a record of this run (a record of another run dir logged in this process is ignored)."""
        if Path(run_dir) == self.cfg.resolved_run_dir:
            self.records.append(record)

    def on_notice(self, text: str, level: int) -> None:
        """Notices are for the console; the report keeps none."""

    # -- progress ---------------------------------------------------------------------------------
    def rollout_done(self, rollout_id: int, seconds: float) -> None:
        """Rollout `rollout_id` completed in `seconds` of wall time."""
        self.seconds[rollout_id] = seconds

    def finish(self, status: Status, failure: str | None = None) -> None:
        """The run ended with `status` (`failure`: its root cause when it failed, the stop line when it was
        cancelled)."""
        self.status, self.failure, self.ended = status, failure, self.clock()

    @property
    def total(self) -> int:
        """Rollouts in the whole run (--num-rollout)."""
        return self.cfg.rollout.num_rollout

    @property
    def done(self) -> int:
        """Rollouts completed so far, counting those of earlier processes of the run."""
        return max(self.seconds) + 1 if self.seconds else self.start

    @property
    def elapsed(self) -> float:
        """Seconds since the report was made (the run flow's start), up to the run's end."""
        return (self.ended if self.ended is not None else self.clock()) - self.began

    def eta(self) -> float | None:
        """Seconds until the last rollout is done, from the mean of the last `ETA_WINDOW` rollouts' wall times
        (eval rollouts included, so the evals still to come are counted in proportion); None before the first."""
        if not self.seconds:
            return None
        recent = [self.seconds[k] for k in sorted(self.seconds)[-ETA_WINDOW:]]
        return max(self.end - self.done, 0) * sum(recent) / len(recent)

    # -- numbers ----------------------------------------------------------------------------------
    def rollout(self, rollout_id: int) -> RolloutStats:
        """The numbers of rollout `rollout_id` (the last record of a metric counts: a retried stage logs again)."""
        metrics: dict[str, float] = {}
        steps: dict[int, dict[str, float]] = {}
        evals: dict[int, dict[str, float]] = {}
        for r in self.records:
            if r["kind"] == "eval" and logged_by(r) == rollout_id:
                evals[int(r["rollout_id"])] = accuracies(r["metrics"])
            elif r["rollout_id"] != rollout_id:
                continue
            elif r["kind"] == "step":
                steps[int(r.get("step", 0))] = r["metrics"]
            elif r["kind"] in ("rollout", "perf"):
                metrics.update(r["metrics"])
        seconds = self.seconds.get(rollout_id, metrics.get("perf/step_time"))
        return RolloutStats(
            rollout_id,
            metrics.get("rollout/raw_reward"),
            _mean(steps, "train/ppo_kl"),
            metrics.get("rollout/entropy"),
            _mean(steps, "train/grad_norm"),
            metrics.get("rollout/response_lengths"),
            seconds,
            sorted(evals.items()),
        )

    def evals(self) -> list[tuple[int, dict[str, float]]]:
        """Every eval of the run as (weights version, {eval/NAME: accuracy}), by version (a re-logged eval: the
        last one)."""
        out = {int(r["rollout_id"]): accuracies(r["metrics"]) for r in self.records if r["kind"] == "eval"}
        return sorted(out.items())

    def eval_names(self) -> list[str]:
        """The eval metrics the run logged (`eval/NAME`), in first-logged order."""
        names: dict[str, None] = {}
        for _, values in self.evals():
            names.update(dict.fromkeys(values))
        return list(names)

    def best_eval(self, name: str) -> tuple[int, float] | None:
        """(weights version, value) of the best finite eval of `name`; the earliest one on a tie."""
        points = [(v[name], -version) for version, v in self.evals() if math.isfinite(v.get(name, math.nan))]
        if not points:
            return None
        value, neg_version = max(points)
        return -neg_version, value

    def last_eval(self) -> tuple[int, dict[str, float]] | None:
        """The eval with the latest weights, if any ran."""
        evals = self.evals()
        return evals[-1] if evals else None

    def checks(self) -> list[CheckCount]:
        """Per check metric of the run: how often it passed, and the rollouts where it failed."""
        counts: dict[str, tuple[int, list[int]]] = {}
        for r in self.records:
            if r["kind"] != "check":
                continue
            for name, value in r["metrics"].items():
                if name not in PASS_IS_ONE and name != "check/violations":
                    continue
                ok = value == 1.0 if name in PASS_IS_ONE else value == 0.0
                passed, failed = counts.get(name, (0, []))
                counts[name] = (passed + 1, failed) if ok else (passed, [*failed, int(r["rollout_id"])])
        return [CheckCount(name, passed, failed) for name, (passed, failed) in counts.items()]

    def evaluated_in(self, rollout_id: int) -> bool:
        """Whether rollout `rollout_id`'s flow ran an eval."""
        return bool(self.rollout(rollout_id).evals)


def accuracies(metrics: dict[str, Any]) -> dict[str, float]:
    """The accuracy entries of an eval record (`eval/NAME`; not `eval/step` or `-truncated_ratio`)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if k.startswith("eval/") and k != "eval/step" and not k.endswith("-truncated_ratio")
    }


def _mean(steps: dict[int, dict[str, float]], metric: str) -> float | None:
    values = [float(m[metric]) for m in steps.values() if metric in m]
    return sum(values) / len(values) if values else None


class RunObserver(Protocol):
    """Told about a run as its parent flow makes progress (in the flow's process and thread)."""

    def started(self, report: RunReport) -> None:
        """The run owns its run dir; Ray and the actors start next."""

    def rollout_done(self, report: RunReport, rollout_id: int) -> None:
        """Rollout `rollout_id` completed (its records and wall time are in `report`)."""

    def finished(self, report: RunReport) -> None:
        """The run ended (`report.status`); curves drawn, and the doctor's findings in with --ci-test."""


_OBSERVERS: list[RunObserver] = []


def observe(observer: RunObserver) -> Callable[[], None]:
    """Register `observer` for the runs of this process; returns the function that unregisters it."""
    _OBSERVERS.append(observer)

    def stop() -> None:
        if observer in _OBSERVERS:
            _OBSERVERS.remove(observer)

    return stop


def observers() -> list[RunObserver]:
    """The registered observers (a copy: one may unregister while being told)."""
    return list(_OBSERVERS)
