"""What `rollflow doctor` reads from a run directory: config.yaml, metrics.jsonl, recordings, log-probs, how the
run ended (outcome.json: the root cause the console printed) and the injected faults (faults.jsonl).

Metric series come from metrics.jsonl (every rollout). Per-sample rules read the recordings of at most
`MAX_EXAMINED` rollouts spread evenly over the run, the first and the last always among them. So the doctor of
a 3000-rollout run reads a few dozen Parquet files, not thousands.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any

from artifacts.rundir import Outcome, read_outcome
from artifacts.schema import Sample
from artifacts.store import ArtifactError, RunPaths, read_metadata, read_metrics, read_rollout, read_table
from config.location import relocate
from flows.failure import STAGE_NOTE

MAX_EXAMINED = 32


class DoctorInputError(ValueError):
    """The run directory cannot be diagnosed at all (no config.yaml, unreadable metrics.jsonl); the message is
    one line naming the file."""


def _load_config(path: Path) -> dict[str, Any]:
    from config.yaml_file import read

    if not path.is_file():
        raise DoctorInputError(f"{path.parent} is not a run directory: no {path.name}")
    try:
        data = read(path, str(path))
    except OSError as e:
        raise DoctorInputError(f"{path}: not readable ({type(e).__name__})") from None
    except ValueError as e:  # names the line: duplicate keys, too many aliases, not YAML, not UTF-8
        raise DoctorInputError(str(e)) from None
    if not isinstance(data, dict):
        raise DoctorInputError(f"{path}: expected a mapping at the top level")
    return data


def _load_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """(records that have the metrics.jsonl shape, number of non-empty lines that are not such a record)."""
    if not path.is_file():
        raise DoctorInputError(f"{path}: missing (did the run start?)")
    try:
        lines = sum(1 for line in path.read_bytes().split(b"\n") if line.strip())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # torn lines are counted below instead
            raw = read_metrics(path)
    except OSError as e:
        raise DoctorInputError(f"{path}: not readable ({type(e).__name__}: {e})") from None
    records = [
        r
        for r in raw
        if isinstance(r.get("metrics"), dict)
        and isinstance(r.get("rollout_id"), int)
        and isinstance(r.get("kind"), str)
    ]
    if lines and not records:
        raise DoctorInputError(f'{path}: no line is a metrics record ({{"kind", "rollout_id", "metrics"}})')
    return records, lines - len(records)


_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*([A-Z]\w*)(?::\s*(.*))?$")  # `pkg.mod.Name: message`


def logged_failure(log: Path) -> Outcome | None:
    """The last traceback's exception in a run's log (`Type: message`, module dropped), and the rollout and stage
    the run's note under it names. That is the failure of a run that recorded no outcome.json (killed while
    failing, or written by an older version). None when the log holds no traceback."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    after = lines[starts[-1] + 1 :]
    found = next((m for line in after if line[:1].strip() and (m := _EXCEPTION_LINE.match(line))), None)
    if found is None:
        return None
    name, message = found.groups()
    note = next((line.removeprefix(STAGE_NOTE) for line in after if line.startswith(STAGE_NOTE)), None)
    return Outcome("failed", f"{name}: {message}" if message else name, note)


class RunData:
    """A run directory, read lazily and at most once per artifact. Raises `DoctorInputError` at construction
    when config.yaml or metrics.jsonl cannot be read (a missing metrics.jsonl is no records when the run recorded
    how it ended: it failed before logging any); unreadable recordings are collected in `unreadable`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.paths = RunPaths(self.dir)
        if not self.dir.is_dir():
            raise DoctorInputError(f"{self.dir}: no such directory")
        # paths that lay inside the run dir are read where the run is now (a moved or copied run)
        self.config = relocate(_load_config(self.paths.config), self.dir)
        self.outcome: Outcome | None = read_outcome(self.dir)
        self.outcome_source = "outcome.json"
        if (
            self.outcome is None and not self.paths.metrics.exists()
        ):  # the run ended before it recorded either
            self.outcome, self.outcome_source = logged_failure(self.dir / "logs" / "run.log"), "logs/run.log"
        self.records: list[dict[str, Any]] = []
        self.unusable_lines = 0
        if self.outcome is None or self.paths.metrics.exists():
            self.records, self.unusable_lines = _load_records(self.paths.metrics)
        self.unreadable: dict[str, str] = {}  # path -> why (corrupt or unreadable artifacts met on the way)
        self._samples: dict[tuple[str, int], list[Sample] | None] = {}

    # -- config -------------------------------------------------------------------------------------------
    def cfg(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted name (`rollout.rollout_max_response_len`); `default` when unset or null."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or node.get(part) is None:
                return default
            node = node[part]
        return node

    @cached_property
    def model_config(self) -> dict[str, Any]:
        """config.json of the run's --hf-checkpoint ({} when there is none to read)."""
        path = Path(str(self.cfg("hf_checkpoint", ""))) / "config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- metrics ------------------------------------------------------------------------------------------
    def series(self, kind: str, key: str) -> list[tuple[int, int | None, float]]:
        """(rollout id, step, value) of every `kind` record holding a numeric `key`, in log order."""
        return [
            (r["rollout_id"], r.get("step"), float(r["metrics"][key]))
            for r in self.records
            if r["kind"] == kind
            and isinstance(r["metrics"].get(key), int | float)
            and not isinstance(r["metrics"].get(key), bool)
        ]

    def per_rollout(self, key: str) -> list[tuple[int, float]]:
        """(rollout id, value) of a `rollout`-kind metric, by rollout id (the last value logged wins)."""
        return sorted({rid: v for rid, _, v in self.series("rollout", key)}.items())

    def steps(self, key: str) -> list[tuple[int, int, float]]:
        """(rollout id, step, value) of a `step`-kind metric, by step."""
        return sorted(
            ((rid, int(step), v) for rid, step, v in self.series("step", key) if step is not None),
            key=lambda x: x[1],
        )

    def first_steps(self) -> set[int]:
        """The step number of the first optimizer step of every rollout."""
        first: dict[int, int] = {}
        for r in self.records:
            if r["kind"] == "step" and r.get("step") is not None:
                first[r["rollout_id"]] = min(first.get(r["rollout_id"], int(r["step"])), int(r["step"]))
        return set(first.values())

    @cached_property
    def fault_events(self) -> list[dict[str, Any]]:
        """The lines of faults.jsonl ({request_id, hook, action, status, process, context, error?}) in order;
        [] when the run injected none. Lines that are not such a record are skipped."""
        path = self.dir / "faults.jsonl"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("request_id"), str) and event.get("status"):
                out.append(event)
        return out

    # -- recordings ---------------------------------------------------------------------------------------
    @cached_property
    def rollout_ids(self) -> list[int]:
        """Ids of the rollouts recorded in rollouts/ (rollout_{id:06d}.parquet)."""
        return sorted(
            int(p.stem.split("_")[1])
            for p in (self.dir / "rollouts").glob("rollout_*.parquet")
            if p.stem.split("_")[1].isdigit()
        )

    @cached_property
    def eval_ids(self) -> list[int]:
        """Ids of the eval recordings in rollouts/ (eval_{id:06d}.parquet)."""
        return sorted(
            int(p.stem.split("_")[1])
            for p in (self.dir / "rollouts").glob("eval_*.parquet")
            if p.stem.split("_")[1].isdigit()
        )

    @cached_property
    def examined_ids(self) -> list[int]:
        """At most MAX_EXAMINED rollout ids spread evenly over the run, first and last included."""
        ids = self.rollout_ids
        if len(ids) <= MAX_EXAMINED:
            return ids
        return sorted({ids[round(i * (len(ids) - 1) / (MAX_EXAMINED - 1))] for i in range(MAX_EXAMINED)})

    def _read(self, path: Path, key: tuple[str, int]) -> list[Sample] | None:
        if key not in self._samples:
            try:
                self._samples[key] = read_rollout(path) if path.is_file() else None
            except (ArtifactError, OSError) as e:
                self.unreadable[str(path)] = str(e)
                self._samples[key] = None
        return self._samples[key]

    def samples(self, rollout_id: int) -> list[Sample] | None:
        """The recorded samples of a rollout (None when missing or unreadable)."""
        return self._read(self.paths.rollout(rollout_id), ("rollout", rollout_id))

    def eval_samples(self, eval_id: int) -> list[Sample] | None:
        """The eval samples of eval `eval_id` (None when missing or unreadable)."""
        return self._read(self.paths.eval_rollout(eval_id), ("eval", eval_id))

    def logprob_rows(self, rollout_id: int) -> dict[int, dict[str, Any]] | None:
        """{sample_index: row} of the trainer's log-probs of a rollout (None when missing or unreadable)."""
        path = self.paths.logprobs(rollout_id)
        if not path.is_file():
            return None
        try:
            return {r["sample_index"]: r for r in read_table(path).to_pylist()}
        except (ArtifactError, OSError) as e:
            self.unreadable[str(path)] = str(e)
            return None

    def sampling(self, rollout_id: int) -> dict[str, Any]:
        """The sampling parameters recorded in a rollout file's metadata ({} when absent)."""
        try:
            text = read_metadata(self.paths.rollout(rollout_id)).get("sampling")
            data = json.loads(text) if isinstance(text, str) else text
        except (ArtifactError, OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


# -- small statistics ---------------------------------------------------------------------------------------
def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for fewer than two values)."""
    m = math.fsum(values) / len(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, se


def windows(
    values: list[tuple[int, float]], minimum: int = 8
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]] | None:
    """The first and last quarter (at least two points each) of a per-rollout series, None when it has fewer
    than `minimum` points: a trend is judged between them, with the spread inside each as its noise."""
    if len(values) < minimum:
        return None
    q = max(2, len(values) // 4)
    return values[:q], values[-q:]


def ids(values: list[tuple[int, float]]) -> str:
    """`rollouts 0-3` for a window of (rollout id, value)."""
    return f"rollouts {values[0][0]}-{values[-1][0]}"
