"""Checkpoints verified by content: a byte flipped inside a tensor of a `--save` checkpoint is named, with its file
and tensor, by the trainer's `--load`, by the `--load` check before a run starts and by `lint-ckpt`; a checkpoint
saved before the content hashes loads with a one-line notice; an HF model dir is not judged by them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from artifacts.content_hashes import HASHES_FILE
from artifacts.hashing import tensor_hashes
from artifacts.lint import lint_checkpoint, read_safetensors_header
from config import RunConfig
from flows.cli import main
from flows.doctor import diagnose
from flows.resolve import _check_checkpoint, check_paths
from tests.doctor_runs import Plan, make_run, tokenizer_dir
from tests.unit.test_engine_trainer import _config, _rollout, _trainer, engine  # noqa: F401 (a fixture)

CHANGED = "the file changed after its save; --no-verify-checkpoint loads it anyway"
TENSOR = "model.layers.0.mlp.up_proj.weight"


def flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x40
    file.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def trained(engine, base_checkpoint, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """A --save dir with the checkpoint of one trained rollout (weights, AdamW state with its step, RNG)."""
    tmp = tmp_path_factory.mktemp("trained")
    cfg = _config(base_checkpoint, tmp)
    _, rollout = _rollout(engine, cfg, tmp)
    trainer = _trainer(cfg, base_checkpoint)
    trainer.train_step(rollout, trainer.compute_log_probs(rollout, str(tmp / "lp.parquet")))
    trainer.save(str(tmp / "save"), 0)
    return cfg, trainer, tmp / "save"


@pytest.fixture
def saved(trained, tmp_path):
    """A copy of `trained`'s --save dir for one test to damage."""
    cfg, trainer, save = trained
    shutil.copytree(save, tmp_path / "save")
    return cfg.model_copy(update={"run_dir": str(tmp_path)}), trainer, tmp_path / "save"


def test_a_flipped_byte_in_a_tensor_is_named_by_load_and_lint(saved, base_checkpoint, capsys):
    cfg, trainer, save = saved
    ckpt = save / "iter_0000000"
    recorded = json.loads((ckpt / HASHES_FILE).read_text())["files"]
    assert set(recorded) == {"model.safetensors", "optimizer.safetensors", "rng.safetensors"}
    assert recorded["model.safetensors"]["tensors"] == trainer.tensor_hashes()  # the weights' own hashes
    assert lint_checkpoint(save).problems == [] and lint_checkpoint(save).unverified == []

    model = ckpt / "model.safetensors"
    t = read_safetensors_header(model)[0][TENSOR]
    flip_byte(model, (t.start + t.end) // 2)  # inside the tensor's data, the header untouched
    assert read_safetensors_header(model)[1] == []  # headers alone see nothing wrong
    want = recorded["model.safetensors"]["tensors"][TENSOR][:12]
    from safetensors.torch import load_file

    got = tensor_hashes({TENSOR: load_file(str(model))[TENSOR]})[TENSOR][:12]
    problem = f"model.safetensors: tensor {TENSOR}: saved sha256 {want}, read sha256 {got}"

    fresh = _trainer(cfg, base_checkpoint)
    with pytest.raises(ValueError) as e:
        fresh.load(str(save))
    assert str(e.value) == f"--load {ckpt}: {problem} ({CHANGED})"
    with pytest.raises(ValueError) as e:
        _check_checkpoint(str(save))  # the --load check before anything starts
    assert (
        str(e.value)
        == f"--load {save}: {ckpt / 'model.safetensors'}: tensor {TENSOR}: {problem.split(': ', 2)[2]}"
    )

    ref = cfg.model_copy(update={"ref_load": str(save)})  # the reference model read from a --save dir
    with pytest.raises(ValueError) as e_ref:
        check_paths(ref)
    assert (
        str(e_ref.value)
        == f"--ref-load {save}: {ckpt / 'model.safetensors'}: tensor {TENSOR}: " + (problem.split(": ", 2)[2])
    )

    capsys.readouterr()
    dry = ["run", "--dry-run", "--run-dir", str(save.parent / "run"), "--hf-checkpoint", base_checkpoint]
    assert main([*dry, "--load", str(save)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"rollflow: error: {e.value}"
    assert main(["lint-ckpt", str(save)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == f"{save}: iter_0000000/{problem}"

    # the doctor lints the run's latest saved checkpoint the same way
    run = make_run(
        save.parent / "doctor",
        tokenizer_dir(save.parent / "tok"),
        dataclasses.replace(Plan(), config={"checkpoint": {"save": str(save)}}),
    )
    first = diagnose(run)[0]
    assert (first.severity, first.rule) == ("error", "checkpoint-lint")
    assert first.title == f"checkpoint {ckpt} is inconsistent: {problem}"

    # the opt-out loads it as it is
    skip = _config(base_checkpoint, Path(cfg.run_dir)).model_copy(
        update={"checkpoint": cfg.checkpoint.model_copy(update={"no_verify_checkpoint": True})}
    )
    _check_checkpoint(str(save), verify_content=not skip.checkpoint.no_verify_checkpoint)
    assert _trainer(skip, base_checkpoint).load(str(save)) == 0


def test_a_changed_optimizer_state_is_named_too(saved, base_checkpoint):
    cfg, _, save = saved
    opt = save / "iter_0000000" / "optimizer.safetensors"
    name = f"{TENSOR}::exp_avg_sq"
    t = read_safetensors_header(opt)[0][name]
    flip_byte(opt, t.start)
    with pytest.raises(
        ValueError, match=rf"^--load .*: optimizer\.safetensors: tensor {name}: saved sha256 "
    ):
        _trainer(cfg, base_checkpoint).load(str(save))
    assert [p.where for p in lint_checkpoint(save).problems] == ["iter_0000000/optimizer.safetensors"]


def test_a_checkpoint_without_hashes_loads_with_a_notice(saved, base_checkpoint, capsys):
    cfg, trainer, save = saved
    (save / "iter_0000000" / HASHES_FILE).unlink()  # as a save before the content hashes wrote it
    fresh = _trainer(cfg, base_checkpoint)
    assert fresh.load(str(save)) == 0
    assert all(torch.equal(v, fresh.export_weights()[k]) for k, v in trainer.export_weights().items())
    capsys.readouterr()
    _check_checkpoint(str(save))
    notice = (
        f"--load {save / 'iter_0000000'}: saved without content hashes ({HASHES_FILE}), so its tensors are not "
        "verified"
    )
    assert capsys.readouterr().out.strip().splitlines()[-1] == notice
    assert lint_checkpoint(save).unverified == [str(save / "iter_0000000")]
    assert main(["lint-ckpt", str(save)]) == 0
    assert "1 saved without content hashes, not verified" in capsys.readouterr().out


def test_an_hf_model_dir_has_no_hashes_of_ours_and_passes(base_checkpoint, tmp_path):
    report = lint_checkpoint(base_checkpoint)
    assert report.problems == [] and report.unverified == []
    check_paths(RunConfig.model_validate({"hf_checkpoint": base_checkpoint, "ref_load": base_checkpoint}))
