"""The trainer's micro-batches: right padding, response positions, and the dropped attention mask."""

from __future__ import annotations

import torch

from recipes.tiny_arith.model import build_model, model_config
from tests.helpers import make_sample
from trainers.batching import make_micro_batch

VOCAB, PAD = 40, 0
SHAPES = [(5, 4), (9, 1), (3, 7), (7, 6)]  # (prompt, response) lengths: every row padded differently


def _samples() -> list:
    return [
        make_sample(i, n=n, vocab=VOCAB, prompt_tokens=list(range(1, 1 + p)))
        for i, (p, n) in enumerate(SHAPES)
    ]


def test_micro_batch_is_right_padded_and_points_at_response_tokens():
    samples = _samples()
    mb = make_micro_batch(samples, PAD)
    assert mb.input_ids.shape == (4, 13) and mb.response_tokens.shape == (4, 7)
    for row, (s, (p, n)) in enumerate(zip(samples, SHAPES, strict=True)):
        assert mb.input_ids[row, : p + n].tolist() == s.prompt_tokens + s.response_tokens
        assert mb.input_ids[row, p + n :].eq(PAD).all()
        # logits at position p-1+t predict response token t
        assert mb.response_index[row, :n].tolist() == list(range(p - 1, p - 1 + n))
        assert mb.input_ids[row, mb.response_index[row, :n] + 1].tolist() == s.response_tokens
        assert mb.loss_mask[row].tolist() == [1.0] * n + [0.0] * (7 - n)


def test_response_logits_without_mask_are_bitwise_those_of_the_masked_forward():
    """Why the trainer passes no attention mask: right padding + causal attention means real tokens never
    see padding, so the gathered response logits (and their gradients) are bitwise the masked ones."""
    model = build_model(model_config(VOCAB), seed=0)
    mb = make_micro_batch(_samples(), PAD)
    mask = torch.tensor([[1] * (p + n) + [0] * (13 - p - n) for p, n in SHAPES])
    idx = mb.response_index[:, :, None].expand(-1, -1, VOCAB)
    real = mb.loss_mask.bool()

    def response_logits(**kw) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=mb.input_ids, **kw).logits.gather(1, idx)
        (logits[real] ** 2).sum().backward()
        return logits[real].detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    masked, masked_grads = response_logits(attention_mask=mask)
    unmasked, unmasked_grads = response_logits()
    assert torch.equal(masked, unmasked)
    assert len(masked_grads) == len(unmasked_grads) > 0
    assert all(torch.equal(a, b) for a, b in zip(masked_grads, unmasked_grads, strict=True))
