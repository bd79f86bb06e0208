"""A command pointed at a run dir works on that dir, wherever config.yaml says the run was made: moved and copied
run dirs (synthetic), and run names that are plain names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from artifacts import rundir
from config import CheckpointConfig, DataConfig, DebugConfig, RunConfig, dump_yaml, load_yaml
from config.location import inside, recorded_run_dir, relocate
from flows import cli
from flows.diff import _checkpoint
from flows.doctor.run_data import RunData
from flows.replay import check_replay, load_run_config


def _run_dir(path: Path, *, save: Path | None = None, **fields: object) -> Path:
    """A run dir as `own` leaves it: config.yaml naming itself (absolute), run.json, an empty metrics.jsonl."""
    path.mkdir(parents=True)
    cfg = RunConfig(
        name="orig",
        run_dir=str(path),
        checkpoint=CheckpointConfig(save=str(save or path / "ckpt")),
        **fields,  # type: ignore[arg-type]
    )
    (path / "config.yaml").write_text(dump_yaml(cfg))
    rundir.write_info(path, rundir.new_info("orig"))
    (path / "metrics.jsonl").write_text("")
    return path


def test_relocate_moves_paths_inside_the_recorded_dir_and_keeps_the_others(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    data = {
        "name": "r",
        "run_dir": str(old),
        "hf_checkpoint": "/models/base",
        "checkpoint": {"save": str(old / "ckpt"), "load": str(tmp_path / "elsewhere")},
        "debug": {"load_debug_rollout_data": str(old / "rec" / "{rollout_id}.parquet")},
        "data": {"eval_prompt_data": ["a", str(old / "eval.jsonl"), "b", "/data/b.jsonl"]},
    }
    moved = relocate(data, new)
    assert moved["run_dir"] == str(new)
    assert moved["checkpoint"] == {"save": str(new / "ckpt"), "load": str(tmp_path / "elsewhere")}
    assert moved["debug"]["load_debug_rollout_data"] == str(new / "rec" / "{rollout_id}.parquet")
    assert moved["data"]["eval_prompt_data"] == ["a", str(new / "eval.jsonl"), "b", "/data/b.jsonl"]
    assert moved["hf_checkpoint"] == "/models/base"
    assert data["checkpoint"]["save"] == str(old / "ckpt")  # the input is left as it was


def test_relocate_resolves_relative_paths_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {"name": "r", "checkpoint": {"save": "runs/r/ckpt", "load": "runs/other/ckpt"}}  # run_dir None
    assert recorded_run_dir(data) == tmp_path / "runs" / "r"
    moved = relocate(data, "copies/r")
    assert moved["run_dir"] == str(tmp_path / "copies" / "r")
    assert moved["checkpoint"] == {"save": str(tmp_path / "copies" / "r" / "ckpt"), "load": "runs/other/ckpt"}
    same = relocate(data, "runs/r")
    assert same["checkpoint"] == data["checkpoint"] and same["run_dir"] == str(tmp_path / "runs" / "r")


def test_relocate_survives_hostile_values(tmp_path):
    data = {"run_dir": "a\0b", "data": ["not", "a", "mapping"], "checkpoint": {"save": 3}}
    assert relocate(data, tmp_path)["run_dir"] == str(tmp_path)
    data = {"run_dir": str(tmp_path / "old"), "checkpoint": {"save": "x\0y"}}
    assert relocate(data, tmp_path / "new")["checkpoint"]["save"] == "x\0y"
    assert not inside("x\0y", tmp_path)


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "-x", "", "a" * 101, "a b", "..."])
def test_a_run_name_that_is_not_a_plain_name_is_refused(name):
    with pytest.raises(ValueError, match="letter or digit"):
        RunConfig(name=name)


@pytest.mark.parametrize("name", ["tiny-arith", "a", "run.2", "A_b-c.d", "a" * 100])
def test_plain_run_names_are_accepted(name):
    assert RunConfig(name=name).name == name


@pytest.mark.parametrize("name", ["..", "a" * 300])
def test_the_cli_refuses_a_bad_name_in_one_line_naming_the_flag(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--name", name]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rollflow: error: --name") and "letter or digit" in err
    assert len(err.splitlines()) == 1 and len(err) < 400
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_resume_of_a_copy_runs_in_the_copy(tmp_path):
    orig = _run_dir(tmp_path / "orig")
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    cfg = cli._resumed_config(cli.make_parser().parse_args(["run", "--resume", str(copy)]))
    assert cfg.resolved_run_dir == copy
    assert cfg.checkpoint.save == str(copy / "ckpt")


def test_resume_of_a_moved_run_runs_where_it_is(tmp_path):
    orig = _run_dir(tmp_path / "orig", save=tmp_path / "ckpts")  # --save outside the run dir
    moved = tmp_path / "moved"
    orig.rename(moved)
    cfg = cli._resumed_config(cli.make_parser().parse_args(["run", "--resume", str(moved)]))
    assert cfg.resolved_run_dir == moved
    assert cfg.checkpoint.save == str(tmp_path / "ckpts")  # its own, the original is gone


def test_resume_of_a_copy_that_would_write_into_the_originals_files_is_refused(tmp_path):
    outside = tmp_path / "ckpts"
    orig = _run_dir(tmp_path / "orig", save=outside, debug=DebugConfig(dump_details=str(tmp_path / "dump")))
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    args = cli.make_parser().parse_args(["run", "--resume", str(copy)])
    with pytest.raises(ValueError) as e:
        cli._resumed_config(args)
    message = str(e.value)
    assert message.startswith(f"--resume {copy}: a copy of run")
    assert f"--save {outside}" in message and f"--dump-details {tmp_path / 'dump'}" in message
    assert str(orig) in message
    rundir.write_info(orig, rundir.new_info("other"))  # the original dir now holds another run: no sharing
    assert cli._resumed_config(args).resolved_run_dir == copy


def _rollout(path):
    """A valid recorded rollout at `path` (replay reads it before anything starts)."""
    from artifacts.store import write_rollout
    from tests.helpers import make_sample

    path.parent.mkdir(parents=True, exist_ok=True)
    write_rollout(path, [make_sample(i) for i in range(4)])


def test_replay_reads_the_copy_it_was_given(tmp_path):
    orig = _run_dir(tmp_path / "orig")
    _rollout(orig / "rollouts" / "rollout_000000.parquet")
    copy = tmp_path / "copy"
    shutil.copytree(orig, copy)
    (orig / "rollouts" / "rollout_000000.parquet").unlink()
    check_replay(str(copy), 0, "generate")  # the copy's recording, not the original's (gone)
    assert load_run_config(copy).resolved_run_dir == copy
    (copy / "rollouts" / "rollout_000000.parquet").unlink()
    _rollout(orig / "rollouts" / "rollout_000000.parquet")
    with pytest.raises(FileNotFoundError, match=str(copy / "rollouts")):
        check_replay(str(copy), 0, "generate")
    # rollout 1 starts from the checkpoint of rollout 0: the copy's, though only the original has it
    _rollout(copy / "rollouts" / "rollout_000001.parquet")
    (orig / "ckpt" / "iter_0000000").mkdir(parents=True)
    (orig / "ckpt" / "iter_0000000" / "meta.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=f"checkpoint {copy}/ckpt/iter_0000000 is missing"):
        check_replay(str(copy), 1, "generate")


def test_diff_and_doctor_read_a_moved_runs_checkpoints_where_they_are(tmp_path):
    orig = _run_dir(tmp_path / "orig", data=DataConfig(prompt_data=str(tmp_path / "orig" / "p.jsonl")))
    (orig / "ckpt" / "iter_0000000").mkdir(parents=True)
    (orig / "ckpt" / "iter_0000000" / "model.safetensors").write_bytes(b"x")
    moved = tmp_path / "moved"
    orig.rename(moved)
    assert _checkpoint(moved, 0) == moved / "ckpt" / "iter_0000000" / "model.safetensors"
    run = RunData(moved)
    assert run.cfg("checkpoint.save") == str(moved / "ckpt")
    assert run.cfg("data.prompt_data") == str(moved / "p.jsonl")
    assert load_yaml(moved / "config.yaml")["run_dir"] == str(orig)  # reading changes nothing
