"""--ci-test's re-execution check (trainers/determinism.py), in-process: a deterministic trainer passes it and
trains bitwise as without it; a planted non-deterministic op is named with the stage it runs in."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket

import pytest
import torch

from artifacts.store import write_rollout
from config import RunConfig
from engines.torch_engine.engine import TorchEngine
from flows.resolve import resolve
from rollout.data import prompts_for_rollout
from rollout.requests import build_requests, to_samples
from rollout.source import train_params
from trainers.determinism import NotDeterministic
from trainers.settings import trainer_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def rollout(base_checkpoint, tmp_path_factory):
    """16 samples (4 prompts x 4): two optimizer steps of two micro-batches each."""
    tmp = tmp_path_factory.mktemp("reexecution")
    cfg = RunConfig.model_validate(
        {
            "hf_checkpoint": base_checkpoint,
            "run_dir": str(tmp / "run"),
            "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "train": {"global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3},
        }
    )
    cfg, src = resolve(cfg)
    r = cfg.rollout
    prompts = prompts_for_rollout(src.train.prompts, r.rollout_batch_size, 0, r.rollout_seed, True)
    entries = build_requests(prompts, r.rollout_seed, 0, r.n_samples_per_prompt, train_params(cfg, src.stops))
    outputs = TorchEngine(base_checkpoint).generate([e.request for e in entries])
    samples = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, 0))
    return cfg, write_rollout(tmp / "rollout.parquet", samples), tmp


def _trainer(cfg, checkpoint, *, reexecute: bool, fuse: bool = False):
    from trainers.torch_trainer.trainer import TorchTrainer

    settings = dataclasses.replace(trainer_settings(cfg), ci_reexecute=reexecute, fuse_first_step=fuse)
    trainer = TorchTrainer(settings, checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    return trainer


def _train(cfg, ref, tmp, checkpoint, *, reexecute: bool, fuse: bool = False):
    trainer = _trainer(cfg, checkpoint, reexecute=reexecute, fuse=fuse)
    lp = trainer.compute_log_probs(ref, str(tmp / f"lp_{reexecute}_{fuse}.parquet"))
    return trainer, trainer.train_step(ref, lp)


@pytest.mark.parametrize("fuse", [False, True])
def test_a_deterministic_trainer_passes_and_trains_bitwise_as_without_the_check(
    rollout, base_checkpoint, fuse
):
    cfg, ref, tmp = rollout
    plain, expected = _train(cfg, ref, tmp, base_checkpoint, reexecute=False, fuse=fuse)
    checked, metrics = _train(cfg, ref, tmp, base_checkpoint, reexecute=True, fuse=fuse)
    assert metrics == expected
    assert all(torch.equal(plain.export_weights()[k], v) for k, v in checked.export_weights().items())
    for p, q in zip(plain.params, checked.params, strict=True):
        assert all(torch.equal(v, checked.optimizer.state[q][k]) for k, v in plain.optimizer.state[p].items())


def _plant_noise(trainer, *, train_only: bool) -> None:
    """A planted non-deterministic op: uniform noise on the token log-probs (in the train step's forward only,
    or in every forward)."""
    forward = trainer._token_outputs

    def noisy(model, mb):
        lp, ent = forward(model, mb)
        if torch.is_grad_enabled() or not train_only:
            lp = lp + 1e-3 * torch.rand(lp.shape)
        return lp, ent

    trainer._token_outputs = noisy


@pytest.mark.parametrize(
    "train_only, stage, message",
    [
        (
            False,
            "log-prob",
            r"log-prob is not deterministic: re-executing rollout 0's first micro-batch from its step-boundary "
            r"snapshot gave log-prob \S+ vs \S+ \(sample_index 0, response token 0\) on the same weights and inputs",
        ),
        (
            True,
            "train-step",
            r"train-step is not deterministic: re-executing rollout 0's first micro-batch from its step-boundary "
            r"snapshot gave train/\w+ \S+ vs \S+",
        ),
    ],
)
def test_a_planted_non_deterministic_op_is_named_with_its_stage(
    rollout, base_checkpoint, train_only, stage, message
):
    cfg, ref, tmp = rollout
    trainer = _trainer(cfg, base_checkpoint, reexecute=True)
    _plant_noise(trainer, train_only=train_only)
    lp = trainer.compute_log_probs(ref, str(tmp / f"lp_noisy_{stage}.parquet"))
    initial = {k: v.clone() for k, v in trainer.export_weights().items()}
    with pytest.raises(NotDeterministic) as e:
        trainer.train_step(ref, lp)
    assert e.value.stage == stage
    assert re.fullmatch(message, str(e.value)), str(e.value)
    # failed as any step fails: the weights are the step boundary's, the rollout is not applied
    assert all(torch.equal(initial[k], v) for k, v in trainer.export_weights().items())
    assert trainer.last_applied_rollout == -1 and trainer.global_step == 0


@pytest.mark.parametrize("planted", [False, True])
def test_the_megatron_backend_passes_clean_and_names_a_planted_op(tmp_path, planted):
    pytest.importorskip("megatron.core")
    from tests.megatron_helpers import build_hf_model, free_port, run_config, synthetic_rollout
    from trainers.megatron.trainer import MegatronTrainer

    ckpt = build_hf_model(tmp_path / "qwen2")
    _, ref = synthetic_rollout(tmp_path / "r0.parquet", vocab=30)
    cfg = run_config(ckpt, train_backend="megatron")

    def trainer(reexecute: bool):
        settings = dataclasses.replace(trainer_settings(cfg), ci_reexecute=reexecute, fuse_first_step=False)
        t = MegatronTrainer(settings, str(ckpt), 0, 1, device="cpu")
        t.setup("127.0.0.1", free_port())
        return t

    checked = trainer(True)
    if planted:
        _plant_noise(checked, train_only=True)
    lp = checked.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    if planted:
        with pytest.raises(
            NotDeterministic, match=r"^train-step is not deterministic: re-executing rollout 0's "
        ):
            checked.train_step(ref, lp)
        return
    plain = trainer(False)
    expected = plain.train_step(ref, plain.compute_log_probs(ref, str(tmp_path / "lp_plain.parquet")))
    assert checked.train_step(ref, lp) == expected
    assert all(torch.equal(plain.export_weights()[k], v) for k, v in checked.export_weights().items())
