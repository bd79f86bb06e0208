"""Unit tests for the long-arith scale recipes (long-arith-50m, long-arith-0.5b): their shapes and parameter counts
(on the meta device: nothing is allocated), the padded tokenizer, the presets, and a tiny shape built by the same
builder run through the engine and the torch trainer (the real sizes are built only by runs and benches)."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest
import torch

from config.presets import SCALE_VOCAB_SIZE
from recipes.long_arith.data import make_problems, solution
from recipes.long_arith.tokenizer import build_tokenizer as long_arith_tokenizer
from recipes.long_arith_scale.model import SHAPES, VOCAB_SIZE, ModelShape, model_config, num_parameters
from recipes.long_arith_scale.settings import checkpoint_path
from recipes.long_arith_scale.tokenizer import build_tokenizer

# The 0.5B's head count, KV heads and tied embeddings at a size a test builds in a second (head_dim 4).
TINY = ModelShape(
    hidden_size=56, intermediate_size=64, num_hidden_layers=2, num_attention_heads=14, num_key_value_heads=2
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _meta_count(shape: ModelShape) -> int:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(model_config(shape))
    assert (
        model.lm_head.weight is model.model.embed_tokens.weight
    ) == shape.tie_word_embeddings  # one tensor
    return sum(p.numel() for p in model.parameters())


def test_the_05b_recipe_has_qwen25_05b_shape():
    config = model_config(SHAPES["long-arith-0.5b"])
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (896, 24, 4864)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (14, 2, 151_936)
    assert config.tie_word_embeddings and config.rms_norm_eps == 1e-6 and config.hidden_act == "silu"
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    assert config.max_position_embeddings == 32_768 and not config.use_sliding_window
    assert num_parameters(SHAPES["long-arith-0.5b"]) == _meta_count(SHAPES["long-arith-0.5b"]) == 494_032_768


def test_the_50m_recipe_keeps_the_vocabulary_and_head_size():
    shape = SHAPES["long-arith-50m"]
    config = model_config(shape)
    assert config.vocab_size == VOCAB_SIZE and config.tie_word_embeddings
    assert config.hidden_size // config.num_attention_heads == 64 == 896 // 14
    assert num_parameters(shape) == _meta_count(shape) == 50_704_640
    untied = dataclasses.replace(shape, tie_word_embeddings=False)
    assert num_parameters(untied) == _meta_count(untied) == 50_704_640 + VOCAB_SIZE * 256


def test_the_tokenizer_is_long_ariths_padded_to_the_models_vocabulary(tok):
    short = long_arith_tokenizer()
    assert len(tok) == VOCAB_SIZE == model_config(SHAPES["long-arith-0.5b"]).vocab_size
    vocab, short_vocab = tok.get_vocab(), short.get_vocab()
    assert {t: i for t, i in vocab.items() if i < 17} == {t: i for t, i in short_vocab.items() if i < 17}
    assert vocab[f"<|reserved_{VOCAB_SIZE - 18}|>"] == VOCAB_SIZE - 1
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 0)
    messages = [{"role": "user", "content": "58+64"}]
    for t in (tok, short):
        assert (
            t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == "<|user|>58+64<|assistant|>"
        )
    for p in make_problems(8, seed=0, split="train"):
        text = f"<|user|>{p['question']}<|assistant|>{p['label']}<eos>"
        assert tok.encode(text) == short.encode(text) and max(tok.encode(text)) < 17
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("1a") == [
        5,
        0,
    ]  # a character outside the data's is <pad>, never an id past the vocabulary


def test_the_saved_tokenizer_loads_with_the_same_ids_and_length(tok, tmp_path):
    """transformers loads a tokenizer beside a qwen2 config as Qwen2Tokenizer, which adds an unknown token unless
    the saved config names one: the loaded tokenizer must keep the model's vocabulary size and the ids."""
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    model_config(TINY).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == VOCAB_SIZE and sorted(loaded.all_special_ids) == [0, 1, 2, 3]
    prompt = loaded.apply_chat_template(
        [{"role": "user", "content": "58+64"}], tokenize=False, add_generation_prompt=True
    )
    text = prompt + solution(58, 64) + "<eos>"
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text)
    assert loaded.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", ["long-arith-50m", "long-arith-0.5b"])
def test_the_recipe_names_its_checkpoint_and_fills_in_its_preset_without_building(
    name, tmp_path, monkeypatch
):
    from flows.cli import build_config, make_parser
    from flows.resolve import apply_recipe

    monkeypatch.setenv("ROLLFLOW_CACHE_DIR", str(tmp_path))
    cfg = apply_recipe(build_config(make_parser().parse_args(["run", "--recipe", name])), build=False)
    assert cfg.hf_checkpoint == str(checkpoint_path(name, tmp_path)) and cfg.hf_checkpoint.startswith(
        str(tmp_path / f"{name}-")
    )
    assert not (tmp_path / cfg.hf_checkpoint).exists() and cfg.name == name
    assert cfg.reward.rm_type == "long-arith" and cfg.rollout.rollout_max_response_len == 256
    r, t = cfg.rollout, cfg.train
    assert (r.num_rollout, r.rollout_batch_size, r.n_samples_per_prompt) == (3, 8, 4)
    assert t.use_dynamic_batch_size and t.max_tokens_per_gpu and cfg.steps_per_rollout == 1
    assert t.precision == "auto" and cfg.ci.ci_doctor == "advisory"
    assert SCALE_VOCAB_SIZE == VOCAB_SIZE and cfg.ci.ci_entropy_max == pytest.approx(11.93, abs=0.01)
    assert cfg.eval.eval_interval is None


def test_a_checkpoint_names_its_shape_and_an_unknown_recipe_is_refused(tmp_path):
    from recipes.long_arith_scale.settings import shape_of

    paths = {checkpoint_path(n, tmp_path) for n in SHAPES} | {
        checkpoint_path("long-arith-50m", tmp_path, TINY)
    }
    assert len(paths) == 3  # the shape is part of the key
    seeded = dataclasses.replace(TINY, model_seed=1)
    assert checkpoint_path("long-arith-50m", tmp_path, seeded) != checkpoint_path(
        "long-arith-50m", tmp_path, TINY
    )
    with pytest.raises(ValueError, match="unknown long-arith scale recipe 'long-arith-7b'"):
        shape_of("long-arith-7b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_tiny_shape_builds_once_and_runs_through_engine_and_trainer(tmp_path, monkeypatch):
    """The builder's checkpoint (tied embeddings, 14/2 GQA heads, the padded vocabulary) loads in the engine's
    FastDecoder and in the trainer's shared-prompt forward, and both give the same log-probs."""
    import asyncio

    from artifacts.store import read_table, write_rollout
    from config import RunConfig
    from engines.torch_engine.decoder import FastDecoder
    from engines.torch_engine.engine import TorchEngine
    from flows.resolve import resolve
    from recipes.long_arith_scale import bootstrap
    from rollout.data import prompts_for_rollout
    from rollout.requests import build_requests, to_samples
    from rollout.source import train_params
    from trainers.settings import trainer_settings
    from trainers.torch_trainer import trainer as torch_trainer

    monkeypatch.setenv("ROLLFLOW_CACHE_DIR", str(tmp_path))
    path = bootstrap.ensure_checkpoint("long-arith-50m", tmp_path, TINY, verbose=False)
    assert path == checkpoint_path("long-arith-50m", tmp_path, TINY)
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "DONE"]:
        assert (path / name).is_file(), name
    info = json.loads((path / "bootstrap_info.json").read_text())
    assert info["num_parameters"] == num_parameters(TINY) and not info["trained"]
    monkeypatch.setattr(bootstrap, "_build", lambda *a: pytest.fail("built twice"))
    assert bootstrap.ensure_checkpoint("long-arith-50m", tmp_path, TINY, verbose=False) == path

    cfg, src = resolve(
        RunConfig.model_validate(
            {
                "recipe": "long-arith-50m",
                "hf_checkpoint": str(path),
                "run_dir": str(tmp_path / "run"),
                "rollout": {
                    "rollout_batch_size": 2,
                    "n_samples_per_prompt": 4,
                    "rollout_max_response_len": 6,
                },
                # an untrained model earns no reward (zero advantages): the entropy term gives the step a gradient
                "train": {"entropy_coef": 0.01, "lr": 1e-3, "precision": "fp32"},
            }
        )
    )
    assert len(src.tokenizer) == VOCAB_SIZE
    engine = TorchEngine(path)
    assert FastDecoder.supports(engine.model) and engine.model.config.tie_word_embeddings
    r = cfg.rollout
    prompts = prompts_for_rollout(
        src.train.prompts, r.rollout_batch_size, 0, r.rollout_seed, cfg.data.rollout_shuffle
    )
    entries = build_requests(prompts, r.rollout_seed, 0, r.n_samples_per_prompt, train_params(cfg, src.stops))
    samples = asyncio.run(
        to_samples(
            entries, engine.generate([e.request for e in entries]), src.tokenizer, src.stops, src.scorer, 0
        )
    )
    ref = write_rollout(tmp_path / "rollout.parquet", samples)

    calls = []
    shared = torch_trainer.shared_hidden
    monkeypatch.setattr(torch_trainer, "shared_hidden", lambda *a, **k: calls.append(1) or shared(*a, **k))
    trainer = torch_trainer.TorchTrainer(trainer_settings(cfg), str(path), rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    rows = {
        row["sample_index"]: row["log_probs"]
        for row in read_table(trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))).to_pylist()
    }
    assert calls, "the trainer took the shared-prompt forward"
    diff = max(
        abs(a - b) for s in samples for a, b in zip(s.rollout_log_probs, rows[s.sample_index], strict=True)
    )
    assert diff < 1e-4  # engine and trainer agree on the same weights (float32)
    before = trainer.weights_sha256()
    trainer.train_step(ref, trainer.compute_log_probs(ref, str(tmp_path / "lp2.parquet")))
    weights = trainer.export_weights()
    assert trainer.weights_sha256() != before
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])  # still tied
    engine.update_weights(weights, version=1)
    assert engine.weights_sha256() == trainer.weights_sha256()
