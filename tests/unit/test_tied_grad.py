"""A tied embedding's two gradients (output layer and lookups) formed in one [V, H] buffer (trainers/torch_trainer/
tied.py): the same gradient as autograd's two, no second dense [V, H] gradient, and nothing dropped silently."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from recipes.tiny_arith.model import build_model, model_config
from tests.helpers import make_sample
from trainers.batching import make_micro_batch
from trainers.losses import linear_log_probs_and_entropy
from trainers.torch_trainer.tied import TiedGrad, tied_embedding
from trainers.torch_trainer.trainer import _plainly_tied

V, H = 300, 16


def _case(seed: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """A weight [V, H] requiring grad; two lookups' ids (with repeats and the padding id 0) and their targets."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, H, generator=gen).requires_grad_()
    ids = [torch.randint(0, V, (n,), generator=gen) for n in (23, 11)]
    ids[0][:4], ids[1][:3] = 0, ids[0][5]  # the padding row, and a row both lookups use
    return weight, ids, [torch.randint(0, V, (len(i),), generator=gen) for i in ids]


def _grad(weight: torch.Tensor, ids: list[torch.Tensor], targets: list[torch.Tensor], tied: TiedGrad | None):
    """Two lookups, each through its own nonlinearity and the output layer; returns the outputs and .grad."""
    weight.grad = None
    outs = []
    for i, t in zip(ids, targets, strict=True):
        x = tied_embedding(i, weight, 0, tied) if tied is not None else F.embedding(i, weight, padding_idx=0)
        sink = None if tied is None else tied.take_dense
        outs += linear_log_probs_and_entropy(torch.tanh(x), weight, t, chunk_rows=8, weight_grad_sink=sink)
    sum(o.sum() for o in outs).backward()
    assert weight.grad is not None and weight.grad.layout == torch.strided
    return [o.detach() for o in outs], weight.grad.clone()


def test_one_buffer_gives_autograds_gradient_and_the_same_outputs():
    weight, ids, targets = _case(0)
    plain_out, plain = _grad(weight, ids, targets, None)
    tied = TiedGrad()
    tied_out, through = _grad(weight, ids, targets, tied)
    assert all(torch.equal(a, b) for a, b in zip(plain_out, tied_out, strict=True))
    assert torch.allclose(through, plain, rtol=1e-6, atol=1e-7)
    assert tied.lookups == 0 and tied.buffer is None  # the last lookup returned the buffer


def test_a_handed_over_gradient_no_lookup_returns_is_an_error():
    weight, ids, targets = _case(1)
    tied = TiedGrad()
    tied_embedding(ids[0], weight, 0, tied)  # its output never reaches the loss: its backward never runs
    hidden = torch.randn(len(ids[1]), H, requires_grad=True)
    lp, _ = linear_log_probs_and_entropy(hidden, weight, targets[1], weight_grad_sink=tied.take_dense)
    with pytest.raises(RuntimeError, match=r"tied embedding's gradient .*\(1 lookup\(s\) never ran"):
        lp.sum().backward()


def test_the_output_layer_keeps_its_gradient_when_no_lookup_is_left():
    assert TiedGrad().take_dense(torch.ones(V, H)) is False  # returned to autograd, not kept
    weight = torch.randn(V, H, requires_grad=True)
    with torch.no_grad():  # nothing recorded: a plain lookup, counted nowhere
        tied = TiedGrad()
        assert torch.equal(
            tied_embedding(torch.tensor([1, 0]), weight, 0, tied), F.embedding(torch.tensor([1, 0]), weight)
        )
        assert tied.lookups == 0


@pytest.mark.parametrize("shared", [True, False])
def test_the_torch_trainers_tied_forward_builds_no_dense_embedding_gradient(shared):
    """A tiny-arith model (tied) through the trainer's token outputs, both layouts: the lookups' backward is the
    tied one (no EmbeddingBackward0 and its [V, H] zeros), and the gradient is the generic path's (within
    float32 rounding, tests/unit/test_token_outputs.py)."""
    from tests.unit.test_token_outputs import _fast_and_plain

    model = build_model(model_config(40), seed=0)
    assert _plainly_tied(model)
    prompt = list(range(1, 9))  # shared: 3 groups of 16 repeat it (as test_shared_prompt_forward_matches...)
    samples = [
        make_sample(i, n=1 + (i * 7) % 8, vocab=40, prompt_tokens=prompt if shared else [1 + i % 30, 2, 3])
        for i in range(48)
    ]
    mb = make_micro_batch(samples, 0)
    assert (mb.shared is not None) is shared
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _fast_and_plain(model, mb, temperature=1.0)
    names = [e.name for e in prof.events()]
    assert "_TiedEmbeddingBackward" in names  # the trainer's path
    assert names.count("EmbeddingBackward0") == 1  # the generic path's forward only
