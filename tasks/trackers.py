"""Experiment trackers fed by `log_metrics`: Weights & Biases and TensorBoard, with slime's flags, metric
names and step keys.

Each tracker is opened lazily by the first record of a run, so a run that fails before logging anything
creates no W&B run. It lives until `finish_trackers` at the end of the run, once per run directory and
process. slime's step keys: rollout and perf records are logged at `rollout/step` = rollout id, train steps at
`train/step`, evals at `eval/step` = the rollout id slime gives the eval (`eval_step`). `check` records are
not slime metrics and stay in metrics.jsonl and the Prefect UI.

Failure policy: a missing package is refused before the run starts (`require_trackers`, called when the
config is resolved), naming the extra to install. A tracker that fails while logging raises `TrackerError`
out of `log_metrics`. So the stage fails visibly (Prefect retries it, then the run fails), as a failing
`wandb.log` does in slime. The record is already in metrics.jsonl by then. A tracker that fails to finish
is reported on stderr and does not change the run's outcome (slime's `finish_tracking` does the same).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Protocol

from config import LoggingConfig, RunConfig

# The step key of each record kind, as slime logs them (perf records share the rollout's step).
STEP_KEYS = {"rollout": "rollout/step", "perf": "rollout/step", "step": "train/step", "eval": "eval/step"}

# slime's `_init_wandb_common`: each metric family is plotted against its own step key in W&B.
WANDB_STEP_METRICS = {
    "train/*": "train/step",
    "rollout/*": "rollout/step",
    "eval/*": "eval/step",
    "perf/*": "rollout/step",
}

# tracker -> (module that must be importable, the extra that installs it)
EXTRAS = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}


class TrackerError(RuntimeError):
    """A tracker could not log a record."""


class Tracker(Protocol):
    """One experiment tracker of one run."""

    name: str

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, Any]) -> None:
        """Record one metrics.jsonl record (`kind` in STEP_KEYS) at its slime step key."""

    def finish(self) -> None:
        """Flush and close; no `log` follows."""


def eval_step(eval_id: int) -> int:
    """slime's `eval/step` of eval `eval_id`: the rollout it follows (eval E runs on the weights rollout E - 1
    trained), 0 for the eval of the starting weights, as slime's `eval(rollout_id)` logs them."""
    return max(eval_id - 1, 0)


def step_value(kind: str, rollout_id: int, step: int | None) -> int:
    """The value of the record's step key: the optimizer step for train records, `eval_step` for evals, else the
    rollout id."""
    if kind == "step" and step is not None:
        return step
    return eval_step(rollout_id) if kind == "eval" else rollout_id


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a record (bools count as numbers; text and lists are left out)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def _missing_extra(tracker: str) -> str | None:
    module, extra = EXTRAS[tracker]
    if importlib.util.find_spec(module) is not None:
        return None
    flag = "--use-wandb" if tracker == "wandb" else "--use-tensorboard"
    return (
        f"{flag} needs the '{module}' package, which is not installed: install the extra with "
        f"ROLLFLOW_EXTRAS=dev,{extra} scripts/setup (or pip install -e '.[{extra}]')"
    )


def require_trackers(logging: LoggingConfig) -> None:
    """Raise ValueError naming the flag and the extra when a tracker that is turned on cannot start:
    its package is missing, or --use-tensorboard has neither --tb-project-name nor $TENSORBOARD_DIR."""
    problems = []
    if logging.use_wandb:
        problems.append(_missing_extra("wandb"))
    if logging.use_tensorboard:
        problems.append(_missing_extra("tensorboard"))
        if logging.tb_project_name is None and not os.environ.get("TENSORBOARD_DIR"):
            problems.append(
                "--use-tensorboard needs --tb-project-name (logs go to "
                "tensorboard_log/<project>/<experiment>) or the TENSORBOARD_DIR environment variable"
            )
    found = [p for p in problems if p]
    if found:
        raise ValueError("; ".join(found))


def tensorboard_dir(logging: LoggingConfig, now: datetime.datetime | None = None) -> Path:
    """slime's layout: $TENSORBOARD_DIR if set, else tensorboard_log/<project>/<experiment> in the working
    directory, the experiment defaulting to the start time (YYYYmmdd_HHMMSS)."""
    if os.environ.get("TENSORBOARD_DIR"):
        return Path(os.environ["TENSORBOARD_DIR"]).resolve()
    experiment = logging.tb_experiment_name or (now or datetime.datetime.now()).strftime("%Y%m%d_%H%M%S")
    return Path("tensorboard_log", str(logging.tb_project_name), experiment).resolve()


class WandbTracker:
    """One W&B run per rollflow run, named --name, its config the resolved run config."""

    name = "W&B"

    def __init__(self, cfg: RunConfig) -> None:
        import wandb

        lg = cfg.logging
        if lg.wandb_dir:
            Path(lg.wandb_dir).mkdir(parents=True, exist_ok=True)  # W&B's service fails on a missing dir
        key = os.environ.get("WANDB_API_KEY")
        if key and (lg.wandb_mode or os.environ.get("WANDB_MODE", "online")) == "online":
            # slime logs in with --wandb-key at --wandb-host only when online; offline runs never reach a server
            wandb.login(key=key, host=lg.wandb_host)
        # console="off": the process's stdout belongs to rollflow (and Prefect's log capture); every metric
        # reaches W&B as history anyway. reinit="create_new": runs in one process each get their own W&B run.
        self.run = wandb.init(
            project=lg.wandb_project,
            entity=lg.wandb_team,
            group=lg.wandb_group,
            name=cfg.name,
            dir=lg.wandb_dir,
            mode=lg.wandb_mode,
            config=json.loads(cfg.model_dump_json()),
            settings=wandb.Settings(console="off"),
            reinit="create_new",
        )
        for key in sorted(set(WANDB_STEP_METRICS.values())):
            self.run.define_metric(key)
        for pattern, key in WANDB_STEP_METRICS.items():
            self.run.define_metric(pattern, step_metric=key)

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, Any]) -> None:
        """`run.log` of the record with its step key set, as slime's `logging_utils.log` does."""
        self.run.log({**scalars(metrics), STEP_KEYS[kind]: step_value(kind, rollout_id, step)})

    def finish(self) -> None:
        """End the W&B run (offline: completes the local .wandb file)."""
        self.run.finish()


class TensorboardTracker:
    """A SummaryWriter under `tensorboard_dir`: one scalar per metric at the record's step."""

    name = "TensorBoard"

    def __init__(self, cfg: RunConfig) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = tensorboard_dir(cfg.logging)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # 10 s instead of the default 120 s: `tensorboard --logdir` watching a short run sees it progress
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=10)

    def log(self, kind: str, rollout_id: int, step: int | None, metrics: dict[str, Any]) -> None:
        """`add_scalar` of every metric but the step key itself, at the step key's value (slime's adapter)."""
        key, value = STEP_KEYS[kind], step_value(kind, rollout_id, step)
        for name, number in scalars(metrics).items():
            if name != key:
                self.writer.add_scalar(name, number, global_step=value)

    def finish(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


_OPEN: dict[Path, list[Tracker]] = {}
_LOCK = threading.Lock()


def _open(cfg: RunConfig) -> list[Tracker]:
    """The run's trackers, created by its first record."""
    with _LOCK:
        key = cfg.resolved_run_dir
        if key not in _OPEN:
            require_trackers(cfg.logging)
            trackers: list[Tracker] = []
            if cfg.logging.use_wandb:
                trackers.append(WandbTracker(cfg))
            if cfg.logging.use_tensorboard:
                trackers.append(TensorboardTracker(cfg))
            _OPEN[key] = trackers
        return _OPEN[key]


def track(
    cfg: RunConfig, kind: str, rollout_id: int, metrics: dict[str, Any], step: int | None = None
) -> None:
    """Send one record to every tracker the config turns on; raises TrackerError naming the tracker and record."""
    lg = cfg.logging
    if kind not in STEP_KEYS or not (lg.use_wandb or lg.use_tensorboard):
        return
    for tracker in _open(cfg):
        try:
            tracker.log(kind, rollout_id, step, metrics)
        except Exception as e:
            raise TrackerError(
                f"{tracker.name} failed to log the {kind} record of rollout {rollout_id}: "
                f"{type(e).__name__}: {e}"
            ) from e


def finish_trackers(cfg: RunConfig) -> list[str]:
    """Finish the run's trackers (all of them, whatever fails); returns the failures, also printed to stderr.
    A later record of the same run dir opens new trackers."""
    with _LOCK:
        trackers = _OPEN.pop(cfg.resolved_run_dir, [])
    errors = []
    for tracker in trackers:
        try:
            tracker.finish()
        except Exception as e:
            errors.append(
                f"{tracker.name} failed to finish (its files may be incomplete): {type(e).__name__}: {e}"
            )
            traceback.print_exc(file=sys.stderr)
    for line in errors:
        print(f"rollflow: {line}", file=sys.stderr, flush=True)
    return errors
