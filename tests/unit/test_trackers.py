"""W&B (offline) and TensorBoard trackers, driven through `log_metrics` and read back from their files:
slime's metric names, each family at its own step key, files complete after the run is closed."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from artifacts.store import RunPaths, read_metrics
from config import RunConfig
from flows.cli import main
from tasks import trackers
from tasks.metrics import close_run, log_metrics
from tests.helpers import wandb_records


def _cfg(tmp_path: Path, **logging: object) -> RunConfig:
    return RunConfig.model_validate({"name": "trk", "run_dir": str(tmp_path / "run"), "logging": logging})


def _log_a_short_run(cfg: RunConfig) -> None:
    """Two rollouts of two optimizer steps each, evals before and after, perf and check records."""
    log_metrics(
        cfg, "eval", 0, {"eval/tiny-arith": 0.25, "eval/tiny-arith-truncated_ratio": 0.0, "eval/step": 0}
    )
    for rid in range(2):
        log_metrics(
            cfg, "rollout", rid, {"rollout/raw_reward": 0.5 + rid, "rollout/response_lengths": 4.0 + rid}
        )
        log_metrics(cfg, "perf", rid, {"perf/rollout_time": 1.5})
        log_metrics(cfg, "rollout", rid, {"rollout/entropy": 0.6 - 0.1 * rid})
        for s in range(2):
            step = 2 * rid + s
            log_metrics(
                cfg,
                "step",
                rid,
                {"train/loss": 1.0 / (step + 1), "train/grad_norm": 2.0 + step, "train/step": step},
                step=step,
            )
        log_metrics(cfg, "check", rid, {"check/finite_metrics": 1.0})
    log_metrics(
        cfg, "eval", 2, {"eval/tiny-arith": 0.5, "eval/tiny-arith-truncated_ratio": 0.0, "eval/step": 1}
    )


def test_tensorboard_scalars_use_slime_names_dir_and_step_keys(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    cfg = _cfg(tmp_path, use_tensorboard=True, tb_project_name="proj", tb_experiment_name="exp1")
    _log_a_short_run(cfg)
    assert close_run(cfg) == cfg.resolved_run_dir / "plots" / "curves.png"

    log_dir = tmp_path / "tensorboard_log" / "proj" / "exp1"  # slime's layout, under the working directory
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    values = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert steps["rollout/raw_reward"] == [0, 1] and values["rollout/raw_reward"] == [0.5, 1.5]
    assert steps["rollout/entropy"] == [0, 1] and steps["perf/rollout_time"] == [0, 1]  # perf at rollout/step
    assert steps["train/loss"] == [0, 1, 2, 3] and values["train/grad_norm"] == [2.0, 3.0, 4.0, 5.0]
    assert steps["eval/tiny-arith"] == [0, 1] and values["eval/tiny-arith"] == [0.25, 0.5]
    # the step keys are the x axis, not scalars; check records are not slime metrics
    assert not {"train/step", "eval/step", "rollout/step"} & set(steps)
    assert not [t for t in steps if t.startswith("check/")]


def test_tensorboard_dir_follows_slime_defaults(tmp_path, monkeypatch):
    import datetime

    from config import LoggingConfig

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    lg = LoggingConfig(use_tensorboard=True, tb_project_name="p")
    when = datetime.datetime(2026, 12, 1, 9, 8, 7)
    assert trackers.tensorboard_dir(lg, when) == tmp_path / "tensorboard_log" / "p" / "20261201_090807"
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    assert trackers.tensorboard_dir(lg, when) == tmp_path / "tb"


def test_wandb_offline_history_has_slime_names_and_step_metrics(tmp_path):
    cfg = _cfg(
        tmp_path,
        use_wandb=True,
        wandb_mode="offline",
        wandb_dir=str(tmp_path / "wb"),
        wandb_project="rollflow-test",
        wandb_group="grp",
    )
    _log_a_short_run(cfg)
    close_run(cfg)

    files = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    records = wandb_records(files[0])
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds  # finished: the run's exit record is written
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.run_group, run.display_name) == ("rollflow-test", "grp", "trk")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["rollout"]["num_rollout"] == cfg.rollout.num_rollout  # the run's config

    # slime's define_metric: each family plotted against its own step key
    metrics = {
        r.metric.glob_name: r.metric.step_metric
        for r in records
        if r.WhichOneof("record_type") == "metric" and r.metric.glob_name
    }
    assert metrics == {
        "train/*": "train/step",
        "rollout/*": "rollout/step",
        "eval/*": "eval/step",
        "perf/*": "rollout/step",
    }

    rows = [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]

    def series(name: str, key: str) -> list[tuple[int, float]]:
        return [(row[key], row[name]) for row in rows if name in row]

    assert series("rollout/raw_reward", "rollout/step") == [(0, 0.5), (1, 1.5)]
    assert series("perf/rollout_time", "rollout/step") == [(0, 1.5), (1, 1.5)]
    assert series("train/loss", "train/step") == [(0, 1.0), (1, 0.5), (2, 1 / 3), (3, 0.25)]
    # slime's eval(rollout_id): the starting weights at 0, the eval after rollout 1 at 1
    assert series("eval/tiny-arith", "eval/step") == [(0, 0.25), (1, 0.5)]
    assert not [k for row in rows for k in row if k.startswith("check/")]
    # every row carries exactly its family's step key (W&B adds a defined step key that is missing, so a row
    # logged at the wrong key would show both)
    family = {"rollout": "rollout/step", "perf": "rollout/step", "train": "train/step", "eval": "eval/step"}
    for row in rows:
        names = [k for k in row if not k.startswith("_") and not k.endswith("/step")]
        assert {k for k in row if k.endswith("/step")} == {family[n.split("/")[0]] for n in names}, row


def test_no_tracker_is_opened_when_none_is_on(tmp_path):
    cfg = _cfg(tmp_path)
    log_metrics(cfg, "rollout", 0, {"rollout/raw_reward": 1.0})
    assert cfg.resolved_run_dir not in trackers._OPEN
    assert read_metrics(RunPaths(cfg.resolved_run_dir).metrics)[0]["metrics"] == {"rollout/raw_reward": 1.0}


def test_a_tracker_that_fails_to_log_raises_after_the_record_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    cfg = _cfg(tmp_path, use_tensorboard=True)

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(trackers.TensorboardTracker, "log", broken)
    with pytest.raises(
        trackers.TrackerError,
        match="TensorBoard failed to log the rollout record of rollout 3: OSError: disk full",
    ):
        log_metrics(cfg, "rollout", 3, {"rollout/raw_reward": 1.0})
    assert len(read_metrics(RunPaths(cfg.resolved_run_dir).metrics)) == 1
    assert trackers.finish_trackers(cfg) == []


def test_a_tracker_that_fails_to_finish_is_reported_and_the_plot_still_drawn(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    cfg = _cfg(tmp_path, use_tensorboard=True)
    log_metrics(cfg, "rollout", 0, {"rollout/raw_reward": 1.0})

    def broken(self):
        raise OSError("disk full")

    monkeypatch.setattr(trackers.TensorboardTracker, "finish", broken)
    assert close_run(cfg) is not None
    assert (
        "TensorBoard failed to finish (its files may be incomplete): OSError: disk full"
        in capsys.readouterr().err
    )


def _without(monkeypatch, module: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )


@pytest.mark.parametrize(
    "flag, module, extra",
    [("--use-wandb", "wandb", "wandb"), ("--use-tensorboard", "tensorboard", "tensorboard")],
)
def test_missing_package_is_refused_before_the_run_naming_the_extra(flag, module, extra, monkeypatch, capsys):
    import sys

    _without(monkeypatch, module)
    monkeypatch.delitem(sys.modules, "flows.run", raising=False)
    assert main(["run", flag, "--tb-project-name", "p"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{flag} needs the '{module}' package" in err and f"ROLLFLOW_EXTRAS=dev,{extra} scripts/setup" in err
    )
    assert "flows.run" not in sys.modules  # neither Ray nor Prefect was imported


def test_tensorboard_needs_a_project_name_or_tensorboard_dir(monkeypatch, tmp_path):
    from config import LoggingConfig

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with pytest.raises(ValueError, match="--use-tensorboard needs --tb-project-name"):
        trackers.require_trackers(LoggingConfig(use_tensorboard=True))
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path))
    trackers.require_trackers(LoggingConfig(use_tensorboard=True))


def test_tracker_flags_parse_with_slime_names():
    from flows.cli import build_config, make_parser

    cfg = build_config(
        make_parser().parse_args(
            [
                "run",
                "--use-wandb",
                "--wandb-project",
                "p",
                "--wandb-group",
                "g",
                "--wandb-mode",
                "offline",
                "--wandb-dir",
                "/tmp/w",
                "--use-tensorboard",
                "--tb-project-name",
                "tp",
                "--tb-experiment-name",
                "te",
            ]
        )
    )
    lg = cfg.logging
    assert (lg.use_wandb, lg.wandb_project, lg.wandb_group, lg.wandb_mode, lg.wandb_dir) == (
        True,
        "p",
        "g",
        "offline",
        "/tmp/w",
    )
    assert (lg.use_tensorboard, lg.tb_project_name, lg.tb_experiment_name) == (True, "tp", "te")
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--wandb-mode", "cloud"])


def test_an_eval_is_logged_at_the_rollout_id_slime_gives_it():
    from tasks.trackers import eval_step, step_value

    # slime evaluates the starting weights as eval(0) and the weights rollout N trained as eval(N)
    assert [eval_step(e) for e in (0, 1, 5, 11)] == [0, 0, 4, 10]
    assert step_value("eval", 5, None) == 4 and step_value("rollout", 5, None) == 5
