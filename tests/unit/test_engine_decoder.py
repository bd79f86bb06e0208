"""The embedded engine's fast decoder gives what the plain HF forward gives; its sampler draws each row from its
distribution."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engines.base import GenerateRequest, SamplingParams
from engines.torch_engine import engine as engine_mod
from engines.torch_engine.decoder import FastDecoder, FastWeights, HFDecoder
from engines.torch_engine.engine import TorchEngine, counter_uniform, sample_by_inversion


@pytest.mark.parametrize("scale", [0.5, 8.0])  # flat, peaked
def test_sampling_by_inversion_draws_each_row_from_its_distribution(scale):
    """Each token's share of 4,000 draws (one per seed) is its probability, and a row draws the same token alone
    as in a batch."""
    gen = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(12, generator=gen) * scale, dim=-1)
    seeds = torch.arange(4000) * 7919 + 1
    drawn = sample_by_inversion(logp.expand(4000, -1).contiguous(), seeds, step=3)
    share = torch.bincount(drawn, minlength=12) / 4000
    assert (share - logp.exp()).abs().max() < 0.03, (share, logp.exp())
    mixed = torch.log_softmax(torch.randn(4000, 12, generator=gen), dim=-1)
    mixed[::2] = logp
    assert torch.equal(sample_by_inversion(mixed, seeds, 3)[::2], drawn[::2])
    assert not torch.equal(sample_by_inversion(logp.expand(4000, -1).contiguous(), seeds, 4), drawn)
    # the running sum written into a caller's buffer (the engine's logits, spent by then) draws the same, and
    # leaves the log-probs as they were
    before, scratch = mixed.clone(), torch.full_like(mixed, float("nan"))
    assert torch.equal(sample_by_inversion(mixed, seeds, 3, out=scratch)[::2], drawn[::2])
    assert torch.equal(mixed, before) and not scratch.isnan().any()


@pytest.mark.parametrize("u", [1.0, 0.5 / 2**24])  # u x total rounds to the total; the smallest uniform
def test_a_token_of_zero_probability_is_never_drawn(u, monkeypatch):
    """Filtered tokens (-inf) at both ends of a row and between its tokens: the draw at either extreme of u is the
    last or the first token with a probability; a row with one token left always draws it."""
    monkeypatch.setattr(engine_mod, "counter_uniform", lambda seeds, step: torch.full(seeds.shape, u))
    logp = torch.full((3, 9), float("-inf"))
    logp[0, [2, 5, 6]] = torch.log_softmax(torch.tensor([0.3, 1.0, 2.0]), dim=-1)
    logp[1, 4] = 0.0
    logp[2, [0, 8]] = math.log(0.5)
    got = sample_by_inversion(logp, torch.arange(3), 0).tolist()
    assert got == ([6, 4, 8] if u == 1.0 else [2, 4, 0])


def test_a_row_holding_a_nan_draws_its_first_nan():
    """A broken row (a NaN in its logits) draws where its NaN is, so that its recorded log-prob is NaN and the run's
    checks report it; the other rows draw as alone."""
    logp = torch.log_softmax(torch.randn(4, 10, generator=torch.Generator().manual_seed(3)), dim=-1)
    broken = logp.clone()
    broken[1, [4, 7]] = float("nan")
    broken[2] = float("nan")
    seeds = torch.arange(4)
    got = sample_by_inversion(broken, seeds, 0)
    assert got[1] == 4 and got[2] == 0
    assert torch.equal(got[[0, 3]], sample_by_inversion(logp, seeds, 0)[[0, 3]])


def _splitmix64(x: int) -> int:
    """The reference splitmix64 output function on Python ints (uint64)."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_counter_uniform_is_splitmix64_of_the_counter():
    """The sampler's uniforms, bit for bit: a request's tokens are a function of its seed only while these bits
    stay the same."""
    seeds = torch.tensor([0, 7919, -(2**62) - 5, 2**62 + 3])
    before = seeds.clone()
    mask = (1 << 64) - 1
    for step in (0, 17, 2**40 + 1):
        u = counter_uniform(seeds, step)
        for r, seed in enumerate(seeds.tolist()):
            counter = (_splitmix64(seed & mask) + step * 0x9E3779B97F4A7C15) & mask
            bits = torch.tensor(_splitmix64(counter) >> 40, dtype=torch.float32)
            assert u[r] == (bits + 0.5) / 2**24, (step, r)  # in float32, as the engine computes it
    assert torch.equal(seeds, before)  # computed in place on temporaries only


def _llama(tmp_path):
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    return str(tmp_path / "llama")


@pytest.fixture(params=["tiny-arith", "llama"])
def checkpoint(request, base_checkpoint, tmp_path):
    return base_checkpoint if request.param == "tiny-arith" else _llama(tmp_path)


def test_fast_decoder_matches_the_hf_forward(checkpoint):
    eng = TorchEngine(checkpoint)
    assert FastDecoder.supports(eng.model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    key_mask = torch.tensor([[False, False] + [True] * 6, [True] * 8])
    positions = (key_mask[:, :5].long().cumsum(-1) - 1).clamp(min=0)
    fast, hf = FastDecoder(FastWeights(eng.model, 64), 8), HFDecoder(eng.model)
    with torch.inference_mode():
        assert torch.allclose(
            fast.prefill(ids, positions, key_mask), hf.prefill(ids, positions, key_mask), atol=1e-5
        )
        pos, tok = positions[:, -1] + 1, torch.tensor([9, 10])
        for _ in range(2):
            assert torch.allclose(fast.decode(tok, pos), hf.decode(tok, pos), atol=1e-5)
            pos = pos + 1
        fast.keep(torch.tensor([1]))
        hf.keep(torch.tensor([1]))
        assert torch.allclose(fast.decode(tok[1:], pos[1:]), hf.decode(tok[1:], pos[1:]), atol=1e-5)


def test_dropping_finished_rows_changes_no_output(checkpoint, monkeypatch):
    """Rows that stop early leave the batch; every row's tokens are still those it gets alone, and those the
    HF forward gives."""
    eng = TorchEngine(checkpoint)
    reqs = [
        GenerateRequest(
            (2, 7, 11, 14, 8)[: 3 + i % 3],
            seed=i,
            params=SamplingParams(max_new_tokens=1 + (i * 5) % 12, stop_token_ids=(1,)),
        )
        for i in range(16)
    ]
    together = eng.generate(reqs)
    # rows leave the batch at different steps (max_new_tokens 1..12, and the stop token); how many distinct
    # lengths there are depends on the tiny-arith model this machine trained (3 here, 4+ elsewhere)
    assert len({len(o.response_tokens) for o in together}) >= 2
    alone = [eng.generate([r])[0] for r in reqs]
    assert [o.response_tokens for o in together] == [o.response_tokens for o in alone]
    monkeypatch.setattr(engine_mod.FastDecoder, "supports", staticmethod(lambda model: False))
    hf = eng.generate(reqs)
    assert [o.response_tokens for o in hf] == [o.response_tokens for o in together]
    assert (
        max(
            abs(a - b)
            for x, y in zip(hf, together, strict=True)
            for a, b in zip(x.log_probs, y.log_probs, strict=True)
        )
        < 1e-5
    )


def test_fast_weights_follow_a_weight_update(base_checkpoint):
    eng = TorchEngine(base_checkpoint)
    req = [GenerateRequest((2, 7, 11), seed=3, params=SamplingParams(max_new_tokens=4))]
    before = eng.generate(req)[0]
    w = eng.get_weights()
    eng.update_weights({k: v * 0.0 for k, v in w.items()}, version=1)  # all logits equal: log-prob -log(V)
    zeroed = eng.generate(req)[0]
    assert zeroed.log_probs[0] == pytest.approx(
        -torch.log(torch.tensor(float(eng.model.config.vocab_size))).item()
    )
    eng.update_weights(w, version=2)
    assert eng.generate(req)[0].response_tokens == before.response_tokens


def test_fast_weights_are_the_only_copy_of_the_fused_parameters(base_checkpoint):
    eng = TorchEngine(base_checkpoint)
    req = [GenerateRequest((2, 7, 11), seed=3, params=SamplingParams(max_new_tokens=4))]
    before = eng.generate(req)[0]
    layer = eng.model.model.layers[0]
    _, qkv, _, _, _, gate_up, _ = eng._fast.layers[0]
    for fused, parts in [(qkv, ["q_proj", "k_proj", "v_proj"]), (gate_up, ["gate_proj", "up_proj"])]:
        mods = [getattr(layer.self_attn if p[0] in "qkv" else layer.mlp, p) for p in parts]
        assert all(m.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr() for m in mods)
        assert torch.equal(torch.cat([m.weight for m in mods]), fused)
    # a checkpoint-shaped state dict still comes out (one contiguous tensor per name), and a round trip holds
    state = eng.get_weights()
    assert all(t.is_contiguous() for t in state.values())
    eng.update_weights(state, version=0)
    assert eng.generate(req)[0] == before
