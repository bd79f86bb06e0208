"""The torch trainer's fast token outputs: the chunked output layer + log-softmax, and length buckets.
Each must give what the plain path gives (full logits, torch's log_softmax), values and gradients."""

from __future__ import annotations

import random
import types

import pytest
import torch

from recipes.tiny_arith.model import build_model, model_config
from tests.helpers import make_sample
from trainers.batching import length_buckets, make_micro_batch
from trainers.core import TrainerCore
from trainers.losses import entropy_from_logits, linear_log_probs_and_entropy, log_probs_from_logits
from trainers.torch_trainer.trainer import TorchTrainer, _plainly_tied, has_plain_output_layer


def _output_layer_case(seed: int, n: int) -> tuple[torch.Tensor, ...]:
    """hidden [n, 16] and weight [300, 16] (both requiring grad), tokens [n], and upstream gradients of the
    log-probs and the entropy, [n] each."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 16, generator=gen, requires_grad=True)
    weight = torch.randn(300, 16, generator=gen, requires_grad=True)
    tokens = torch.randint(0, 300, (n,), generator=gen)
    return hidden, weight, tokens, torch.randn(n, generator=gen), torch.randn(n, generator=gen)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_output_layer_matches_log_softmax_values_and_gradients(temperature):
    hidden, weight, tokens, g_lp, g_ent = _output_layer_case(0, 37)

    def grads(lp: torch.Tensor, ent: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), [hidden, weight]))

    logits = (hidden @ weight.t() / temperature)[None]
    ref_lp, ref_ent = log_probs_from_logits(logits, tokens[None])[0], entropy_from_logits(logits)[0]
    lp, ent = linear_log_probs_and_entropy(hidden, weight, tokens, temperature=temperature, chunk_rows=8)
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    for a, b in zip(grads(lp, ent), grads(ref_lp, ref_ent), strict=True):
        assert torch.allclose(a, b, atol=1e-4)
    lp, _ = linear_log_probs_and_entropy(hidden, weight, tokens, temperature=temperature, chunk_rows=8)
    (g_hidden,) = torch.autograd.grad((lp * g_lp).sum(), [hidden])  # the entropy unused: no gradient from it
    ref_lp = log_probs_from_logits((hidden @ weight.t() / temperature)[None], tokens[None])[0]
    (ref_g_hidden,) = torch.autograd.grad((ref_lp * g_lp).sum(), [hidden])
    assert torch.allclose(g_hidden, ref_g_hidden, atol=1e-4)
    with pytest.raises(ValueError, match="expected hidden"):
        linear_log_probs_and_entropy(hidden[None], weight, tokens)


@pytest.mark.parametrize("matmul_dtype", [None, torch.bfloat16])
def test_recomputed_output_layer_keeps_no_chunk_and_gives_bitwise_the_same_gradients(matmul_dtype):
    hidden, weight, tokens, g_lp, g_ent = _output_layer_case(1, 29)

    def run(recompute: bool) -> list[torch.Tensor]:
        lp, ent = linear_log_probs_and_entropy(
            hidden,
            weight,
            tokens,
            temperature=0.7,
            chunk_rows=8,
            matmul_dtype=matmul_dtype,
            recompute=recompute,
        )
        kept = lp.grad_fn.log_p  # the [rows, V] chunks held for the backward
        assert (kept == []) if recompute else (len(kept) == 4 and kept[0].shape == (8, 300))
        return [lp, ent, *torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), [hidden, weight])]

    for a, b in zip(run(False), run(True), strict=True):
        assert torch.equal(a, b)


def _cost(buckets: list[list[int]], lengths: list[int]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) + 64 for b in buckets)


def test_length_buckets_cover_every_sample_and_cost_no_more_than_one_forward():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        buckets = length_buckets(lengths, overhead_tokens=64)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
        flat = [i for b in buckets for i in b]
        assert [lengths[i] for i in flat] == sorted(lengths)  # shortest first, contiguous in length

        assert _cost(buckets, lengths) <= _cost([list(range(len(lengths)))], lengths)
        assert _cost(buckets, lengths) <= _cost([[i] for i in range(len(lengths))], lengths)
    assert length_buckets([10, 200, 12, 198], overhead_tokens=10) == [[0, 2], [3, 1]]
    assert length_buckets([10, 200], overhead_tokens=10_000) == [[0, 1]]


def test_torch_trainer_token_outputs_match_the_generic_path():
    vocab, pad = 40, 0
    model = build_model(model_config(vocab), seed=0)
    assert has_plain_output_layer(model)
    shapes = [(5, 200), (9, 1), (3, 190), (7, 6), (4, 198), (6, 2), (5, 180), (8, 3)]
    samples = [
        make_sample(i, n=n, vocab=vocab, prompt_tokens=list(range(1, 1 + p)))
        for i, (p, n) in enumerate(shapes)
    ]
    mb = make_micro_batch(samples, pad)
    assert len(mb.buckets) > 1  # the lengths are spread: several forwards
    fast, plain = _fast_and_plain(model, mb, temperature=0.8)
    real = mb.loss_mask.bool()
    assert torch.equal(fast[0][~real], torch.zeros_like(fast[0][~real]))


def _fast_and_plain(
    model: torch.nn.Module, mb, temperature: float, rtol: float = 1e-4
) -> tuple[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]], ...]:
    """(log-probs, entropy, gradients) of the torch trainer's token outputs and of the generic path, checked
    equal within float32 rounding (gradients within `rtol` too: other sums, other rounding)."""
    trainer = types.SimpleNamespace(
        s=types.SimpleNamespace(
            temperature=temperature, entropy_coef=0.1, recompute_granularity=None, precision="fp32"
        ),
        device=torch.device("cpu"),
        _plain_head=True,
        _tied_embedding=_plainly_tied(model),
        _shared_prompts=True,
        model=model,
        _recomputed=frozenset(),
    )
    trainer._response_logits = lambda m, b: TorchTrainer._response_logits(trainer, m, b)  # type: ignore[arg-type]
    trainer._autocast = lambda: TorchTrainer._autocast(trainer)  # type: ignore[arg-type]

    def run(fn) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp, ent = fn(trainer, model, mb)
        ((lp * mb.loss_mask).sum() + (ent * mb.loss_mask).sum()).backward()
        return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]

    fast, plain = run(TorchTrainer._token_outputs), run(TrainerCore._token_outputs)
    real = mb.loss_mask.bool()
    assert torch.allclose(fast[0][real], plain[0][real], atol=1e-5)
    assert torch.allclose(fast[1][real], plain[1][real], atol=1e-5)
    for a, b in zip(fast[2], plain[2], strict=True):
        assert torch.allclose(a, b, rtol=rtol, atol=1e-5)
    return fast, plain


def test_shared_prompt_forward_matches_the_generic_path():
    """A GRPO-shaped micro-batch (groups repeating a prompt) runs each prompt once; values and gradients are
    those of the plain forward over every full sequence."""
    vocab, pad = 40, 0
    model = build_model(model_config(vocab), seed=0)
    prompts = [list(range(1, 9)), list(range(3, 8)), [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
    samples = []
    for i in range(48):  # 3 groups x 16 samples, responses of 1-8 tokens
        samples.append(make_sample(i, n=1 + (i * 7) % 8, vocab=vocab, prompt_tokens=prompts[i // 16]))
    mb = make_micro_batch(samples, pad)
    assert mb.shared is not None and mb.shared.prompt_valid.shape[0] == 3
    # packed: one row per real token (each distinct prompt once, each response's inputs), no padding rows
    real_rows = sum(map(len, prompts)) + sum(s.response_length - 1 for s in samples)
    assert mb.shared.ids.shape == (real_rows,) and mb.shared.unpack.numel() > real_rows
    _fast_and_plain(model, mb, temperature=1.0)
    distinct = [make_sample(i, n=3, vocab=vocab, prompt_tokens=[1 + i, 2, 3]) for i in range(4)]
    assert make_micro_batch(distinct, pad).shared is None  # no prompt repeats: nothing to share
