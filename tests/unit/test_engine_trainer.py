"""The embedded engine and the torch trainer, in-process (no Ray, no Prefect)."""

from __future__ import annotations

import socket

import pytest
import torch

from artifacts.store import read_table, write_rollout
from engines.base import GenerateRequest, SamplingParams
from engines.rollout import build_requests, problems_for_rollout, to_samples
from engines.torch_engine.engine import TorchEngine
from flows.config import RunConfig
from recipes.registry import get_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(base_checkpoint):
    return TorchEngine(base_checkpoint)


def _rollout(engine, cfg, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.hf_checkpoint)
    recipe = get_recipe(cfg.recipe)
    problems = problems_for_rollout(recipe.train_problems(), cfg, 0)
    entries = build_requests(problems, tok, recipe, cfg, 0, cfg.rollout.n_samples_per_prompt, 1.0)
    outputs = engine.generate([e["request"] for e in entries])
    samples = to_samples(entries, outputs, tok, recipe, 0)
    return samples, write_rollout(tmp_path / "rollout.parquet", samples)


def test_seeded_sampling_is_independent_of_batch_layout(engine):
    reqs = [GenerateRequest((2, 7, 11, 14, 8, 7, 16, 3), seed=s, params=SamplingParams(max_new_tokens=6))
            for s in range(12)]
    together = engine.generate(reqs)
    alone = [engine.generate([r])[0] for r in reqs[:3]]
    shuffled = engine.generate(list(reversed(reqs)))[::-1]
    assert [o.response_tokens for o in together[:3]] == [o.response_tokens for o in alone]
    assert [o.response_tokens for o in together] == [o.response_tokens for o in shuffled]
    assert len({o.response_tokens for o in together}) > 1  # different seeds really sample differently


def test_stop_tokens_max_tokens_and_top_k(engine):
    eos = 1
    outs = engine.generate([GenerateRequest((2, 7, 11, 14, 8, 7, 16, 3), seed=s,
                                            params=SamplingParams(max_new_tokens=3, stop_token_ids=(eos,),
                                                                  top_k=1))
                            for s in range(4)])
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


def test_trainer_logprobs_match_engine_and_step_is_applied_once(engine, base_checkpoint, tmp_path):
    from trainers.torch_trainer.trainer import TorchTrainer

    cfg = RunConfig.model_validate({
        "hf_checkpoint": base_checkpoint, "run_dir": str(tmp_path),
        "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
        "train": {"global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3}})
    samples, ref = _rollout(engine, cfg, tmp_path)
    trainer = TorchTrainer(cfg, base_checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    rows = {r["sample_index"]: r for r in read_table(lp_ref).to_pylist()}
    diff = max(abs(a - b) for s in samples for a, b in zip(s.rollout_log_probs, rows[s.sample_index]["log_probs"],
                                                          strict=True))
    assert diff < 1e-4  # engine and trainer agree on the same weights

    before = {k: v.clone() for k, v in trainer.export_weights().items()}
    metrics = trainer.train_step(ref, lp_ref)
    assert len(metrics) == 2 and metrics[0]["train/ppo_kl"] == 0.0 and metrics[0]["train/pg_clipfrac"] == 0.0
    after = trainer.export_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.train_step(ref, lp_ref) is metrics  # a retry never applies the rollout twice
    assert all(torch.equal(after[k], v) for k, v in trainer.export_weights().items())
