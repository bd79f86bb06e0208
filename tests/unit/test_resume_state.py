"""A resume's trainer state: a snapshot or checkpoint damaged by a machine crash is named, never loaded
(artifacts.checkpoints.damage, flows.runtime._state_before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from artifacts.checkpoints import damage
from config import RunConfig
from flows import runtime
from trainers.actor import snapshot_dir


def _checkpoint(path: Path, rollout_id: int) -> Path:
    """An iter_ dir as the torch trainer writes one: weights, optimizer, scheduler and meta.json."""
    path.mkdir(parents=True)
    save_file({"w": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(4)}, str(path / "model.safetensors"))
    save_file({"w::exp_avg": torch.ones(3, 4)}, str(path / "optimizer.safetensors"))
    (path / "scheduler.json").write_text(json.dumps({"last_epoch": rollout_id}))
    (path / "meta.json").write_text(json.dumps({"rollout_id": rollout_id, "run_id": "r1"}))
    return path


def _cut(file: Path, keep: int) -> None:
    file.write_bytes(file.read_bytes()[:keep])


def test_an_intact_checkpoint_has_no_damage(tmp_path: Path) -> None:
    assert damage(_checkpoint(tmp_path / "iter_0000003", 3)) is None


@pytest.mark.parametrize(
    ("file", "keep", "problem"),
    [
        ("model.safetensors", 0, "model.safetensors is empty"),
        (
            "model.safetensors",
            100,
            "model.safetensors: truncated: the header claims {n} bytes, the file has 92 ",
        ),
        (
            "optimizer.safetensors",
            -8,
            "optimizer.safetensors: truncated: tensor w::exp_avg's bytes end at {whole}, ",
        ),
        ("meta.json", 0, "meta.json is not JSON"),
        ("meta.json", 10, "meta.json is not JSON"),
        ("scheduler.json", 0, "scheduler.json is empty"),
        ("scheduler.json", 5, "scheduler.json is not JSON"),
    ],
)
def test_a_file_cut_short_is_named(tmp_path: Path, file: str, keep: int, problem: str) -> None:
    ckpt = _checkpoint(tmp_path / "iter_0000003", 3)
    whole = (ckpt / file).stat().st_size
    header = int.from_bytes((ckpt / file).read_bytes()[:8], "little")
    _cut(ckpt / file, keep)
    found = damage(ckpt)
    assert found is not None and found.startswith(problem.format(n=header, whole=whole))


def test_meta_without_a_rollout_id_is_damage(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "iter_0000003", 3)
    (ckpt / "meta.json").write_text("{}")
    assert damage(ckpt) == "meta.json holds no rollout id"


def _cfg(tmp_path: Path, save: bool = True) -> RunConfig:
    checkpoint = {"save": str(tmp_path / "ckpt")} if save else {}
    return RunConfig.model_validate({"run_dir": str(tmp_path / "run"), "checkpoint": checkpoint})


def test_resume_takes_the_snapshot_else_the_checkpoint_of_the_rollout_before(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    snap = _checkpoint(snapshot_dir(cfg.resolved_run_dir) / "iter_0000004", 4)
    saved = _checkpoint(tmp_path / "ckpt" / "iter_0000004", 4)
    assert runtime._state_before(cfg, 5) == (snap, None)
    _cut(snap / "model.safetensors", 0)
    assert runtime._state_before(cfg, 5) == (saved, f"{snap} is damaged (model.safetensors is empty)")


def test_a_damaged_state_names_the_latest_intact_one_before_it(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    snaps = snapshot_dir(cfg.resolved_run_dir)
    _checkpoint(tmp_path / "ckpt" / "iter_0000001", 1)
    older = _checkpoint(snaps / "iter_0000003", 3)
    _checkpoint(
        tmp_path / "ckpt" / "iter_0000003.tmp-99", 3
    )  # never published (a save cut before its rename)
    _cut(_checkpoint(snaps / "iter_0000004", 4) / "meta.json", 0)
    _cut(_checkpoint(tmp_path / "ckpt" / "iter_0000004", 4) / "optimizer.safetensors", 50)
    with pytest.raises(ValueError) as e:
        runtime._state_before(cfg, 5)
    message = str(e.value)
    assert message.startswith(
        f"cannot resume at rollout 5: {snaps / 'iter_0000004'} is damaged (meta.json is not JSON); "
        f"{tmp_path / 'ckpt' / 'iter_0000004'} is damaged (optimizer.safetensors: truncated"
    )
    assert message.endswith(
        "Continue the run from an earlier state of it (the rollouts after it run again): `rollflow run --config "
        f"{cfg.resolved_run_dir / 'config.yaml'} --run-dir {cfg.resolved_run_dir} --load {older}`"
    )
    # the older snapshot damaged too: the --save checkpoint of rollout 1 is the latest intact state
    _cut(older / "model.safetensors", 0)
    with pytest.raises(ValueError, match=f"--load {tmp_path / 'ckpt' / 'iter_0000001'}`"):
        runtime._state_before(cfg, 5)


def test_with_nothing_intact_the_run_starts_over(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, save=False)
    _cut(_checkpoint(snapshot_dir(cfg.resolved_run_dir) / "iter_0000001", 1) / "model.safetensors", 0)
    with pytest.raises(
        ValueError, match="No earlier state of the run is intact: start it over with --overwrite"
    ):
        runtime._state_before(cfg, 2)
    with pytest.raises(ValueError, match="no snapshot or checkpoint of rollout 2"):
        runtime._state_before(cfg, 3)
