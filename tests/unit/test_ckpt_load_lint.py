"""Checkpoints as a `--load` reads them: `lint-ckpt` names every file the load needs and ignores the iter_N.tmp-*
dirs of saves that died, `--load` is linted before anything starts, and a run removes its unfinished saves."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from artifacts.checkpoints import load_problems, remove_unfinished_saves, unfinished_saves
from artifacts.lint import CheckpointNotFound, lint_checkpoint
from config import RunConfig
from flows import runtime
from flows.cli import main
from flows.resolve import _check_checkpoint
from tests.bad_inputs import whole_checkpoint
from trainers.actor import snapshot_dir


def test_a_whole_checkpoint_has_no_load_problem(tmp_path):
    d = whole_checkpoint(tmp_path / "save" / "iter_0000003", 3)
    assert load_problems(d) == []
    assert lint_checkpoint(tmp_path / "save").problems == []
    _check_checkpoint(str(tmp_path / "save"))  # does not raise


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("optimizer.safetensors", "missing (a load reads the optimizer state from it)"),
        ("rng.safetensors", "missing (a load reads the RNG state from it)"),
        ("scheduler.json", "missing (a load reads the LR schedule from it)"),
    ],
)
def test_each_file_a_load_reads_is_named_when_missing(tmp_path, name, problem):
    d = whole_checkpoint(tmp_path / "save" / "iter_0000001", 1)
    (d / name).unlink()
    assert load_problems(d) == [(name, problem)]
    assert [str(p) for p in lint_checkpoint(tmp_path / "save").problems] == [
        f"iter_0000001/{name}: {problem}"
    ]
    with pytest.raises(ValueError, match=rf"^--load {tmp_path / 'save'}: {d / name}: missing"):
        _check_checkpoint(str(tmp_path / "save"))


def test_damaged_files_and_meta_without_a_step_are_named(tmp_path):
    d = whole_checkpoint(tmp_path / "iter_0000001", 1)
    (d / "rng.safetensors").write_bytes((d / "rng.safetensors").read_bytes()[:40])
    (d / "scheduler.json").write_text("")
    (d / "meta.json").write_text(json.dumps({"rollout_id": 1}))
    problems = dict(load_problems(d))
    assert problems["scheduler.json"] == "empty"
    assert problems["rng.safetensors"].startswith("truncated")
    assert problems["meta.json"] == "holds no integer global_step"


def test_a_megatron_checkpoint_needs_its_distributed_files(tmp_path):
    d = whole_checkpoint(tmp_path / "iter_0000001", 1)
    (d / "meta.json").write_text(json.dumps({"rollout_id": 1, "global_step": 2, "format": "megatron"}))
    assert [name for name, _ in load_problems(d)] == ["metadata.json", "common.pt", ".metadata", "*.distcp"]
    for name in ("metadata.json", "common.pt", ".metadata", "__0_0.distcp"):
        (d / name).write_text("{}")
    assert load_problems(d) == []


def test_lint_ignores_and_names_unfinished_saves(tmp_path, capsys):
    save = tmp_path / "save"
    whole_checkpoint(save / "iter_0000001", 1)
    stale = save / "iter_0000002.tmp-4242"
    shutil.copytree(save / "iter_0000001", stale)
    (stale / "optimizer.safetensors").unlink()  # the trainer died while writing it
    report = lint_checkpoint(save)
    assert report.dirs == [str(save / "iter_0000001")] and report.problems == []
    assert report.unfinished == ["iter_0000002.tmp-4242"]
    assert main(["lint-ckpt", str(save)]) == 0
    assert capsys.readouterr().out.strip().endswith("ignored 1 unfinished save(s): iter_0000002.tmp-4242)")
    shutil.rmtree(save / "iter_0000001")
    with pytest.raises(CheckpointNotFound, match=r"1 unfinished save\(s\) only: iter_0000002.tmp-4242"):
        lint_checkpoint(save)


def test_lint_ckpt_exits_1_naming_the_missing_optimizer(tmp_path, capsys):
    d = whole_checkpoint(tmp_path / "save" / "iter_0000000")
    (d / "optimizer.safetensors").unlink()
    assert main(["lint-ckpt", str(tmp_path / "save")]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{tmp_path / 'save'}: iter_0000000/optimizer.safetensors: missing (a load reads the optimizer state from it)"
    )


def test_an_iter_dir_without_weights_is_linted_not_skipped(tmp_path):
    d = whole_checkpoint(tmp_path / "save" / "iter_0000000")
    (d / "model.safetensors").unlink()
    assert [str(p) for p in lint_checkpoint(tmp_path / "save").problems] == [
        "iter_0000000/model.safetensors: missing (a load reads the weights from it)"
    ]


def test_a_run_removes_and_logs_the_unfinished_saves_where_it_saves(tmp_path, monkeypatch):
    cfg = RunConfig.model_validate(
        {"name": "r", "run_dir": str(tmp_path / "run"), "checkpoint": {"save": str(tmp_path / "save")}}
    )
    stale = [
        tmp_path / "save" / "iter_0000004.tmp-77",
        snapshot_dir(tmp_path / "run") / "iter_0000001.tmp-ab12",
    ]
    for p in stale:
        p.mkdir(parents=True)
    kept = whole_checkpoint(tmp_path / "save" / "iter_0000003", 3)
    logged: list[tuple[str, int]] = []
    monkeypatch.setattr(
        runtime, "notice", lambda message, level=logging.INFO: logged.append((message, level))
    )
    owned = runtime.own(cfg)
    try:
        assert not any(p.exists() for p in stale) and kept.is_dir()
        assert sorted(m for m, _ in logged if "never finished" in m) == sorted(
            f"removed {p}: a save that never finished (its process died)" for p in stale
        )
    finally:
        owned.release()
    assert remove_unfinished_saves(tmp_path / "nowhere") == [] and unfinished_saves(tmp_path / "save") == []
