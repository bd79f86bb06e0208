"""Owning a run directory: one run at a time (a lock naming pid and host), the run's identity (`run.json`:
run id, start time, the Prefect flow run), and the records a resumed run must not write twice.

A lock is an `fcntl.flock` on `<run dir>/.lock`. The kernel drops it when the owning process dies, however it
dies, so a crashed run never blocks the next one. The file's text names the owner for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from artifacts.atomic import atomic_write_json, atomic_write_text

INFO = "run.json"
OUTCOME = "outcome.json"  # how the run's last process ended, and the root cause the console printed
LOCK = ".lock"
# what a run writes into its run dir (everything `--overwrite` removes; the lock stays)
RECORDS = (
    "config.yaml",
    INFO,
    OUTCOME,
    "metrics.jsonl",
    "faults.jsonl",
    "start_weights.json",
    "rollouts",
    "logprobs",
    "ft",
    "faults",
    "plots",
    "replays",
    "logs",
)


class RunDirBusy(RuntimeError):
    """Another live process owns the run dir."""


@dataclass(frozen=True)
class RunInfo:
    """Identity of the run that owns a run dir."""

    run_id: str
    started_at: float
    name: str
    flow_run_id: str | None = None


def acquire(run_dir: str | Path) -> IO[str]:
    """Lock `run_dir` for this process (created if needed); RunDirBusy names the owner if it is taken. Keep the
    returned file open for the life of the run (closing it releases the lock)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    f = open(d / LOCK, "a+")  # noqa: SIM115 - held open on purpose: the lock lives as long as the file
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _owner(f)
        f.close()
        raise RunDirBusy(
            f"run dir {d} is in use by {owner}; wait for it, or give another --name/--run-dir"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return f


def _owner(lock: IO[str]) -> str:
    """The line the holder of `lock` wrote. It writes it just after it took the lock, so a process that tried at
    the same moment waits for it (up to a second)."""
    for _ in range(100):
        lock.seek(0)
        if line := lock.read().strip():
            return line
        time.sleep(0.01)
    return "another process"


def read_info(run_dir: str | Path) -> RunInfo | None:
    """The run that owns (or owned) `run_dir`, if any."""
    path = Path(run_dir) / INFO
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return RunInfo(**{k: data.get(k) for k in ("run_id", "started_at", "name", "flow_run_id")})


def write_info(run_dir: str | Path, info: RunInfo) -> None:
    atomic_write_json(Path(run_dir) / INFO, asdict(info))


@dataclass(frozen=True)
class Outcome:
    """How a run's process ended: `status` (completed, stopped, cancelled, failed), and for a failure the root
    cause as the console printed it (`error`: `Type: message`; `where`: `rollout N, stage S` when known;
    `gate`: the check that failed a run whose rollouts all completed, e.g. `ci-doctor`)."""

    status: str
    error: str | None = None
    where: str | None = None
    gate: str | None = None


def write_outcome(run_dir: str | Path, outcome: Outcome) -> None:
    """Record how the run ended (replacing what an earlier process of the run recorded)."""
    atomic_write_json(Path(run_dir) / OUTCOME, {**asdict(outcome), "ended_at": time.time()})


def clear_outcome(run_dir: str | Path) -> None:
    """Forget the recorded end of an earlier process of the run (a resumed run has not ended yet)."""
    (Path(run_dir) / OUTCOME).unlink(missing_ok=True)


def read_outcome(run_dir: str | Path) -> Outcome | None:
    """The recorded end of the run at `run_dir`; None when it recorded none (still running, killed, or older)
    or the file is not an outcome record."""
    try:
        data = json.loads((Path(run_dir) / OUTCOME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        return None
    fields = {k: data.get(k) for k in ("error", "where", "gate")}
    return Outcome(data["status"], **{k: v if isinstance(v, str) else None for k, v in fields.items()})


def new_info(name: str) -> RunInfo:
    return RunInfo(run_id=uuid.uuid4().hex[:12], started_at=time.time(), name=name)


def has_records(run_dir: str | Path) -> bool:
    """Whether a run already wrote records into `run_dir`."""
    d = Path(run_dir)
    metrics = d / "metrics.jsonl"
    return (metrics.is_file() and metrics.stat().st_size > 0) or any((d / "rollouts").glob("*.parquet"))


def clear(run_dir: str | Path) -> None:
    """Remove every record of a previous run (`--overwrite`); the lock file stays."""
    d = Path(run_dir)
    for name in RECORDS:
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def completed_rollouts(records: list[dict[str, Any]]) -> int:
    """How many rollouts the run completed: the parent logs `perf/step_time` after each rollout flow ends."""
    done = [r["rollout_id"] for r in records if r["kind"] == "perf" and "perf/step_time" in r["metrics"]]
    return max(done) + 1 if done else 0


def logged_by(record: dict[str, Any]) -> int:
    """The rollout flow that logged a record: eval E is logged after rollout E - 1 (eval 0 before rollout 0)."""
    rid = int(record["rollout_id"])
    return max(rid - 1, 0) if record["kind"] == "eval" else rid


def truncate_records(path: str | Path, start: int) -> int:
    """Keep only the records logged by rollouts before `start` (atomic rewrite of metrics.jsonl); returns how
    many were dropped. A resumed run re-runs rollout `start` from the beginning and logs its records again."""
    p = Path(path)
    if not p.is_file():
        return 0
    lines = [line for line in p.read_text().splitlines() if line.strip()]
    keep = [line for line in lines if logged_by(json.loads(line)) < start]
    atomic_write_text(p, "".join(line + "\n" for line in keep))
    return len(lines) - len(keep)
