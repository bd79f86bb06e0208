"""The embedded engine and the torch trainer, in-process (no Ray, no Prefect)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket

import pytest
import torch

from artifacts.checkpoints import damage, load_problems
from artifacts.lint import lint_checkpoint
from artifacts.store import read_table, write_rollout
from config import RunConfig
from engines.base import GenerateRequest, SamplingParams
from engines.torch_engine.engine import TorchEngine
from flows.resolve import resolve
from rollout.data import prompts_for_rollout
from rollout.requests import build_requests, to_samples
from rollout.source import train_params
from tests.helpers import fail_second_scheduler_step
from trainers.settings import trainer_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(base_checkpoint):
    return TorchEngine(base_checkpoint)


def _config(base_checkpoint, tmp_path, **train):
    """16 samples (4 prompts x 4), two optimizer steps of two micro-batches each, lr 1e-3 (and `train`)."""
    return RunConfig.model_validate(
        {
            "hf_checkpoint": base_checkpoint,
            "run_dir": str(tmp_path),
            "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "train": {"global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3, **train},
        }
    )


def _rollout(engine, cfg, tmp_path, rollout_id=0):
    cfg, src = resolve(cfg)
    r = cfg.rollout
    prompts = prompts_for_rollout(
        src.train.prompts, r.rollout_batch_size, rollout_id, r.rollout_seed, cfg.data.rollout_shuffle
    )
    params = train_params(cfg, src.stops)
    entries = build_requests(prompts, r.rollout_seed, rollout_id, r.n_samples_per_prompt, params)
    outputs = engine.generate([e.request for e in entries])
    samples = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, rollout_id))
    return samples, write_rollout(tmp_path / "rollout.parquet", samples)


def test_seeded_sampling_is_independent_of_batch_layout(engine):
    reqs = [
        GenerateRequest((2, 7, 11, 14, 8, 7, 16, 3), seed=s, params=SamplingParams(max_new_tokens=6))
        for s in range(12)
    ]
    together = engine.generate(reqs)
    alone = [engine.generate([r])[0] for r in reqs[:3]]
    shuffled = engine.generate(list(reversed(reqs)))[::-1]
    assert [o.response_tokens for o in together[:3]] == [o.response_tokens for o in alone]
    assert [o.response_tokens for o in together] == [o.response_tokens for o in shuffled]
    assert len({o.response_tokens for o in together}) > 1  # different seeds really sample differently


def test_stop_tokens_max_tokens_and_top_k(engine):
    eos = 1
    outs = engine.generate(
        [
            GenerateRequest(
                (2, 7, 11, 14, 8, 7, 16, 3),
                seed=s,
                params=SamplingParams(max_new_tokens=3, stop_token_ids=(eos,), top_k=1),
            )
            for s in range(4)
        ]
    )
    for o in outs:
        assert len(o.response_tokens) <= 3 and len(o.log_probs) == len(o.response_tokens)
        assert o.finish_reason == ("stop" if o.response_tokens[-1] == eos else "length")
    assert len({o.response_tokens for o in outs}) == 1  # top-k 1 is greedy whatever the seed


def test_weight_update_round_trip_and_version(engine):
    w = engine.get_weights()
    bumped = {k: v + 1.0 for k, v in w.items()}
    engine.update_weights(bumped, version=7)
    assert engine.weight_version() == 7
    assert all(torch.equal(engine.get_weights([k])[k], bumped[k]) for k in list(w)[:3])
    engine.update_weights(w, version=0)
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights({k: v for k, v in list(w.items())[1:]}, version=1)


def test_engine_tensor_hashes_follow_its_weights_and_name_what_changed(engine):
    from artifacts.hashing import differing_tensors, tensor_hashes

    w = engine.get_weights()
    before = engine.tensor_hashes()
    assert before == tensor_hashes(w) and engine.tensor_hashes() is before  # cached until the weights change
    name = "model.layers.1.mlp.up_proj.weight"
    engine.update_weights({**w, name: w[name] + 1.0}, version=3)
    assert differing_tensors(before, engine.tensor_hashes()) == [name]
    engine.update_weights(w, version=0)
    assert engine.tensor_hashes() == before


def test_trainer_logprobs_match_engine_and_step_is_applied_once(engine, base_checkpoint, tmp_path):
    from trainers.torch_trainer.trainer import TorchTrainer

    cfg = _config(base_checkpoint, tmp_path)
    samples, ref = _rollout(engine, cfg, tmp_path)
    trainer = TorchTrainer(trainer_settings(cfg), base_checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    rows = {r["sample_index"]: r for r in read_table(lp_ref).to_pylist()}
    diff = max(
        abs(a - b)
        for s in samples
        for a, b in zip(s.rollout_log_probs, rows[s.sample_index]["log_probs"], strict=True)
    )
    assert diff < 1e-4  # engine and trainer agree on the same weights

    before = {k: v.clone() for k, v in trainer.export_weights().items()}
    metrics = trainer.train_step(ref, lp_ref)
    assert len(metrics) == 2 and metrics[0]["train/ppo_kl"] == 0.0 and metrics[0]["train/pg_clipfrac"] == 0.0
    after = trainer.export_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in trainer.params)  # no gradients held between steps
    assert trainer.train_step(ref, lp_ref) is metrics  # a retry never applies the rollout twice
    assert all(torch.equal(after[k], v) for k, v in trainer.export_weights().items())


def _trainer(cfg, checkpoint):
    from trainers.torch_trainer.trainer import TorchTrainer

    trainer = TorchTrainer(trainer_settings(cfg), checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    return trainer


def test_failed_step_restores_weights_optimizer_and_schedule(engine, base_checkpoint, tmp_path):
    from artifacts.store import read_rollout
    from trainers.rollout_stats import logprob_stats

    cfg = _config(base_checkpoint, tmp_path, lr_decay_style="cosine")
    _, ref = _rollout(engine, cfg, tmp_path)
    clean = _trainer(cfg, base_checkpoint)
    expected = clean.train_step(ref, clean.compute_log_probs(ref, str(tmp_path / "lp0.parquet")))

    trainer = _trainer(cfg, base_checkpoint)
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    # the trainer-side rollout stats come from memory and equal the ones computed from the files
    assert trainer.rollout_stats(ref, lp_ref) == logprob_stats(
        read_rollout(ref), read_table(lp_ref).to_pylist()
    )
    initial = {k: v.clone() for k, v in trainer.export_weights().items()}
    restore_step = fail_second_scheduler_step(trainer)
    snapshots = []
    trainer._snapshot = lambda weights=True, take=trainer._snapshot: (
        snapshots.append(take(weights)) or snapshots[-1]
    )
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train_step(ref, lp_ref)
    # the first step held no copy of the weights: they were read back from the checkpoint setup loaded
    assert [snap.weights for snap in snapshots] == [None]
    assert all(torch.equal(initial[k], v) for k, v in trainer.export_weights().items())
    assert not trainer.optimizer.state and trainer.global_step == 0
    assert trainer.optimizer.param_groups[0]["lr"] == clean.s.lr and trainer.scheduler.last_epoch == 0

    restore_step()  # the retry trains exactly as if nothing had failed
    assert trainer.train_step(ref, lp_ref) == expected
    assert all(torch.equal(clean.export_weights()[k], v) for k, v in trainer.export_weights().items())
    assert trainer.optimizer.param_groups[0]["lr"] == clean.optimizer.param_groups[0]["lr"]


def test_a_failed_first_step_refuses_to_read_back_a_checkpoint_changed_since_setup(
    engine, base_checkpoint, tmp_path
):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(base_checkpoint, ckpt)
    cfg = _config(str(ckpt), tmp_path)
    _, ref = _rollout(engine, cfg, tmp_path)
    trainer = _trainer(cfg, str(ckpt))
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"")  # rewritten: same bytes, a new modification time
    os.utime(weights, ns=(0, 0))
    fail_second_scheduler_step(trainer)
    with pytest.raises(RuntimeError, match=r"weight files of .*ckpt changed since the trainer loaded them"):
        trainer.train_step(ref, lp_ref)


@pytest.mark.parametrize("boundary", ["memory", "disk"])
def test_failures_after_a_trained_rollout_restore_its_moments_every_time(
    engine, base_checkpoint, tmp_path, boundary
):
    """Once AdamW holds moments, the snapshot restores weights and moments after each of two failed attempts in a
    row (the first restore must not leave the optimizer holding the snapshot's own tensors), and the retry then
    trains exactly as a trainer that never failed. `disk`: the step-boundary snapshot the actor wrote before the
    step is what a failure restores from, and no copy is kept in memory."""
    cfg = _config(base_checkpoint, tmp_path)
    samples, first = _rollout(engine, cfg, tmp_path)
    second = write_rollout(
        tmp_path / "rollout_1.parquet", [dataclasses.replace(s, rollout_id=1) for s in samples]
    )
    clean = _trainer(cfg, base_checkpoint)
    for i, ref in enumerate((first, second)):
        expected = clean.train_step(ref, clean.compute_log_probs(ref, str(tmp_path / f"clean_{i}.parquet")))

    trainer = _trainer(cfg, base_checkpoint)
    trainer.train_step(first, trainer.compute_log_probs(first, str(tmp_path / "lp_0.parquet")))
    if boundary == "disk":  # as the trainer's actor does before each step
        trainer.save(str(tmp_path / "ft"), 0, snapshot=True)
        trainer.boundary_dir = str(tmp_path / "ft")

        def no_copy():
            raise AssertionError("a copy of the weights and optimizer state in memory")

        trainer._snapshot = no_copy
    weights = {k: v.clone() for k, v in trainer.export_weights().items()}
    moments = [{k: v.clone() for k, v in trainer.optimizer.state[p].items()} for p in trainer.params]
    assert moments[0], "the first rollout left AdamW's moments"
    lp_ref = trainer.compute_log_probs(second, str(tmp_path / "lp_1.parquet"))
    for _ in range(2):
        restore_step = fail_second_scheduler_step(trainer)
        with pytest.raises(RuntimeError, match="planted failure"):
            trainer.train_step(second, lp_ref)
        restore_step()
        assert all(torch.equal(weights[k], v) for k, v in trainer.export_weights().items())
        for p, saved in zip(trainer.params, moments, strict=True):
            assert all(torch.equal(saved[k], v) for k, v in trainer.optimizer.state[p].items())

    assert trainer.train_step(second, lp_ref) == expected
    assert all(torch.equal(clean.export_weights()[k], v) for k, v in trainer.export_weights().items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float16])
def test_wire_format_round_trips_bits(dtype):
    from artifacts.wire import from_wire, to_wire

    named = {
        "a": (torch.randn(3, 5) * 100).to(dtype),
        "b.weight": torch.arange(7).to(dtype).reshape(7, 1)[::2],
    }
    wire = to_wire(named)
    for _, array in wire.values():
        array.flags.writeable = False  # as Ray's object store hands them out
    for copy in (True, False):
        back = from_wire(wire, copy=copy)
        for name, t in named.items():
            assert back[name].dtype == dtype and back[name].shape == t.shape
            assert torch.equal(
                back[name].view(torch.uint8) if dtype != torch.int64 else back[name],
                t.contiguous().view(torch.uint8) if dtype != torch.int64 else t,
            )
            assert back[name].is_contiguous()
            # a copy owns its memory; copy=False reads the array's own bytes (an engine's load copies them)
            shares = back[name].data_ptr() == wire[name][1].ctypes.data
            assert shares != copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_bucket_written_to_a_file_reads_back_bitwise_and_is_never_overwritten(dtype, tmp_path):
    from artifacts.wire import read_file, write_file

    named = {
        "a": (torch.randn(3, 5) * 100).to(dtype),
        "b.weight": torch.arange(7).to(dtype).reshape(7, 1)[::2],  # not contiguous
        "empty": torch.zeros(0, 4, dtype=dtype),
    }
    wire = write_file(named, tmp_path / "0.bin")
    back = read_file(wire)
    assert list(back) == list(named)
    for name, t in named.items():
        assert back[name].dtype == dtype and back[name].shape == t.shape
        assert torch.equal(back[name].view(torch.uint8), t.contiguous().view(torch.uint8))
    assert all(offset % 64 == 0 for *_, offset in wire.tensors)
    with pytest.raises(FileExistsError):
        write_file({"a": named["a"]}, tmp_path / "0.bin")
    assert torch.equal(read_file(wire)["a"], named["a"])  # the file is as first written
    only_empty = write_file({"empty": named["empty"]}, tmp_path / "1.bin")
    assert read_file(only_empty)["empty"].shape == (0, 4)


def test_use_rollout_logprobs_trains_on_the_engine_log_probs(engine, base_checkpoint, tmp_path):
    from artifacts.store import read_rollout

    def cfg_for(flag: bool) -> RunConfig:
        return RunConfig.model_validate(
            {
                "hf_checkpoint": base_checkpoint,
                "run_dir": str(tmp_path),
                "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
                "train": {
                    "global_batch_size": 16,
                    "lr": 1e-3,
                    "use_kl_loss": True,
                    "kl_loss_coef": 0.01,
                    "use_rollout_logprobs": flag,
                },
            }
        )

    samples, ref = _rollout(engine, cfg_for(True), tmp_path)
    trainer = _trainer(cfg_for(True), base_checkpoint)
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    assert read_table(lp_ref).column_names == ["sample_index", "ref_log_probs"]  # no actor forward ran
    before = trainer.export_weights()
    trainer.train_step(ref, lp_ref, str(tmp_path / "train_{rollout_id}_{rank}.parquet"))
    dumped = {
        r["sample_index"]: r["log_probs"] for r in read_table(tmp_path / "train_0_0.parquet").to_pylist()
    }
    assert all(dumped[s.sample_index] == s.rollout_log_probs for s in read_rollout(ref))
    assert any(not torch.equal(before[k], v) for k, v in trainer.export_weights().items())

    plain = _trainer(cfg_for(False), base_checkpoint)  # a trainer that recomputes refuses such an artifact
    with pytest.raises(ValueError, match="no trainer log_probs"):
        plain.train_step(ref, lp_ref)


@pytest.mark.parametrize("train", [{}, {"use_kl_loss": True, "kl_loss_coef": 0.01, "entropy_coef": 0.01}])
def test_fused_first_step_trains_bitwise_as_a_separate_log_prob_pass(
    engine, base_checkpoint, tmp_path, train
):
    """The log-prob pass runs the first step's forward and backward by default; training, metrics and the
    log-prob artifact are bitwise those of a separate log-prob forward (--debug-separate-logprob-pass)."""

    def cfg_for(separate: bool) -> RunConfig:
        return RunConfig.model_validate(
            {
                "hf_checkpoint": base_checkpoint,
                "run_dir": str(tmp_path),
                "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
                "train": {"global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3, **train},
                "debug": {"debug_separate_logprob_pass": separate},
            }
        )

    fused, separate = _trainer(cfg_for(False), base_checkpoint), _trainer(cfg_for(True), base_checkpoint)
    assert fused.s.fuse_first_step and not separate.s.fuse_first_step
    for rollout in range(2):
        _, ref = _rollout(engine, cfg_for(False), tmp_path / f"r{rollout}", rollout)
        lp = [
            t.compute_log_probs(ref, str(tmp_path / f"lp{rollout}-{i}.parquet"))
            for i, t in enumerate((fused, separate))
        ]
        assert lp[0].sha256 == lp[1].sha256
        assert fused._fused is not None and separate._fused is None
        assert fused.train_step(ref, lp[0]) == separate.train_step(ref, lp[1])
        assert all(torch.equal(separate.export_weights()[k], v) for k, v in fused.export_weights().items())
        engine.update_weights(fused.export_weights(), rollout + 1)


def test_a_fused_step_is_used_only_for_its_own_rollout_and_weights(engine, base_checkpoint, tmp_path):
    cfg = RunConfig.model_validate(
        {
            "hf_checkpoint": base_checkpoint,
            "run_dir": str(tmp_path),
            "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "train": {"global_batch_size": 16, "lr": 1e-3},
        }
    )
    trainer, clean = _trainer(cfg, base_checkpoint), _trainer(cfg, base_checkpoint)
    _, ref = _rollout(engine, cfg, tmp_path)
    _, other = _rollout(
        engine,
        cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"rollout_seed": 7})}),
        tmp_path / "other",
    )
    trainer.compute_log_probs(other, str(tmp_path / "lp-other.parquet"))  # leaves a fused step for `other`
    lp = clean.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    clean._fused = None  # train this one from the artifact alone, as `rollflow replay ... train-step` does
    assert trainer.train_step(ref, lp) == clean.train_step(ref, lp)
    assert all(torch.equal(clean.export_weights()[k], v) for k, v in trainer.export_weights().items())


def test_a_saved_checkpoint_is_on_disk_before_its_name_and_a_snapshot_is_not_flushed(
    engine, base_checkpoint, tmp_path, monkeypatch
):
    """--save's iter_N/: every file of it fsynced, under its temporary name, before the rename publishes it
    (safetensors and save_pretrained do not flush); the step-boundary snapshot, rewritten every rollout, is not."""
    cfg = _config(base_checkpoint, tmp_path)
    _, rollout = _rollout(engine, cfg, tmp_path)
    trainer = _trainer(cfg, base_checkpoint)
    trainer.train_step(rollout, trainer.compute_log_probs(rollout, str(tmp_path / "lp.parquet")))
    flushed: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))
    )
    trainer.save(str(tmp_path / "save"), 0)
    saved = sorted(p.name for p in (tmp_path / "save" / "iter_0000000").iterdir())
    assert {"model.safetensors", "optimizer.safetensors", "rng.safetensors", "config.json"} <= set(saved)
    before_rename = {os.path.basename(p) for p in flushed if ".tmp-" in os.path.dirname(p)}
    assert set(saved) <= before_rename
    flushed.clear()
    trainer.save(str(tmp_path / "snap"), 0, snapshot=True)
    assert not any(p.endswith(".safetensors") for p in flushed)
    # what a resume checks a snapshot or checkpoint for finds nothing wrong in whole ones
    assert (
        damage(tmp_path / "save" / "iter_0000000") is None
        and damage(tmp_path / "snap" / "iter_0000000") is None
    )
    # and what `--load` and `lint-ckpt` check it for: every file a load reads, the weights against config.json
    assert load_problems(tmp_path / "save" / "iter_0000000") == []
    assert lint_checkpoint(tmp_path / "save").problems == []
