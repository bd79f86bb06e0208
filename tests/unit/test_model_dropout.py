"""A model whose config.json turns dropout on: refused for RL training in one line naming the key (torch and
megatron backends), or, with --allow-model-dropout, dropped out in every batch layout of the torch trainer."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket

import pytest
import torch

from artifacts.store import read_table, write_rollout
from config import RunConfig
from engines.torch_engine.engine import TorchEngine
from flows.resolve import resolve
from rollout.data import prompts_for_rollout
from rollout.requests import build_requests, to_samples
from rollout.source import train_params
from trainers.dropout import dropout_keys
from trainers.megatron.arch import ModelArch
from trainers.settings import trainer_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_dropout(base: str, dest, **dropout) -> str:
    shutil.copytree(base, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **dropout}))
    return str(dest)


def _config(checkpoint: str, tmp_path, **debug) -> RunConfig:
    """One prompt x 32 samples in one micro-batch: a layout where sharing the prompt pays (trainers/batching.py)."""
    return RunConfig.model_validate(
        {
            "hf_checkpoint": checkpoint,
            "run_dir": str(tmp_path / "run"),
            "rollout": {"rollout_batch_size": 1, "n_samples_per_prompt": 32},
            "train": {"global_batch_size": 32, "micro_batch_size": 32},
            "debug": debug,
        }
    )


def _trainer(cfg: RunConfig, checkpoint: str):
    from trainers.torch_trainer.trainer import TorchTrainer

    trainer = TorchTrainer(trainer_settings(cfg), checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    return trainer


def test_dropout_keys_name_every_probability_above_zero():
    config = {
        "attention_dropout": 0.1,
        "hidden_dropout": 0.0,
        "resid_pdrop": 0.2,
        "classifier_dropout": 0.5,  # a classification head's: a causal LM never applies it
        "use_dropout": True,
        "text_config": {"attention_dropout": 0.3},
    }
    assert dropout_keys(config) == [
        ("attention_dropout", 0.1),
        ("resid_pdrop", 0.2),
        ("text_config.attention_dropout", 0.3),
    ]


def test_megatron_refuses_dropout_naming_the_key_and_value():
    config = {
        "model_type": "qwen2",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "vocab_size": 30,
        "attention_dropout": 0.1,
    }
    with pytest.raises(ValueError) as e:
        ModelArch.from_hf_config(config)
    assert str(e.value) == (
        "megatron backend: attention_dropout = 0.1: the backend builds its models without dropout (the old-policy "
        "log-prob pass and the first train step must see the same forward); set it to 0.0"
    )


def test_torch_trainer_refuses_a_model_with_dropout(base_checkpoint, tmp_path):
    ckpt = _with_dropout(base_checkpoint, tmp_path / "dropout", attention_dropout=0.3)
    with pytest.raises(ValueError) as e:
        _trainer(_config(ckpt, tmp_path), ckpt)
    assert str(e.value) == (
        f"{ckpt}/config.json: attention_dropout = 0.3: RL training runs without dropout (the old-policy log-probs "
        "and the first train step would see different forwards); set it to 0.0, or pass --allow-model-dropout "
        "to train with it"
    )


def test_allowed_dropout_drops_out_in_a_batch_of_shared_prompts(base_checkpoint, tmp_path, monkeypatch):
    """Micro-batches whose samples share their prompt would take the shared-prompt forward, which has no dropout;
    an allowed dropout is applied there as in any other layout, so the log-probs differ from the same weights'
    without dropout (and a seed reproduces them)."""
    ckpt = _with_dropout(base_checkpoint, tmp_path / "dropout", attention_dropout=0.3)
    cfg, src = resolve(_config(base_checkpoint, tmp_path))
    r = cfg.rollout
    prompts = prompts_for_rollout(src.train.prompts, r.rollout_batch_size, 0, r.rollout_seed, True)
    entries = build_requests(prompts, r.rollout_seed, 0, r.n_samples_per_prompt, train_params(cfg, src.stops))
    outputs = TorchEngine(base_checkpoint).generate([e.request for e in entries])
    samples = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, 0))
    ref = write_rollout(tmp_path / "rollout.parquet", samples)

    def log_probs(trainer, name: str) -> torch.Tensor:
        torch.manual_seed(0)
        rows = read_table(trainer.compute_log_probs(ref, str(tmp_path / name))).to_pylist()
        return torch.tensor([x for row in rows for x in row["log_probs"]])

    from trainers.torch_trainer import trainer as torch_trainer

    layouts: list[object] = []  # the micro-batches laid out by shared prompt

    def spy(model, sp, *args):
        layouts.append(sp)
        return shared_hidden(model, sp, *args)

    shared_hidden = torch_trainer.shared_hidden
    monkeypatch.setattr(torch_trainer, "shared_hidden", spy)
    plain = log_probs(_trainer(cfg, base_checkpoint), "plain.parquet")
    assert layouts, "without dropout this batch takes the shared-prompt forward"
    dropping = _trainer(_config(ckpt, tmp_path, allow_model_dropout=True), ckpt)
    first = log_probs(dropping, "dropout.parquet")
    assert not torch.equal(first, plain)
    assert torch.equal(log_probs(dropping, "again.parquet"), first)
