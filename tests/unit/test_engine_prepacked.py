"""A bf16 engine on a CPU with AVX512-BF16 / AMX holds its layer matrices and output layer in oneDNN's prepacked
layout while it generates, and only there (a tied output layer keeps its plain embedding too): the model's own
parameters are empty meanwhile, every read or write of the weights gets them back bitwise, a release drops them, and
without bf16 support (or at fp32) the plain layout is used."""

from __future__ import annotations

import pytest
import torch

from engines.base import GenerateRequest, SamplingParams
from engines.torch_engine import engine as engine_module
from engines.torch_engine.decoder import prepacked_linear_supported
from engines.torch_engine.engine import TorchEngine
from tests.unit.test_engine_decoder import _llama
from tests.unit.test_precision_numerics import BF16_LOGP_TOL

needs_bf16 = pytest.mark.skipif(
    not prepacked_linear_supported(torch.bfloat16, torch.device("cpu")),
    reason="this CPU has no bf16 matmul support (AVX512-BF16 / AMX): the engine uses the plain layout",
)


def _requests(n: int = 6, new: int = 12) -> list[GenerateRequest]:
    params = SamplingParams(temperature=1.0, max_new_tokens=new)
    return [GenerateRequest(prompt_tokens=(3 + i % 4, 4, 5, 6), params=params, seed=7 + i) for i in range(n)]


def _layer_weights(engine: TorchEngine) -> list[torch.Tensor]:
    layer = engine._model.model.layers[0]  # as it is, not put back
    return [layer.self_attn.q_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]


@pytest.fixture(params=["tied", "untied"])
def checkpoint(request, base_checkpoint, tmp_path):
    """tiny-arith's model (its output layer is the embedding) and a Llama with its own output layer."""
    return base_checkpoint if request.param == "tied" else _llama(tmp_path)


@needs_bf16
def test_the_weights_are_held_once_prepacked_and_read_back_bitwise(checkpoint):
    engine = TorchEngine(checkpoint, precision="bf16")
    assert engine.health()["linear"] == "onednn-prepacked"
    before, sha = engine.get_weights(), engine.weights_sha256()
    first = engine.generate(_requests())
    # while generating the matrices live only in the prepacked copy: the model's parameters hold no storage
    assert engine._fast is not None and engine._fast.prepacked
    assert all(p.numel() == 0 for p in _layer_weights(engine))
    head = engine._model.lm_head.weight
    tied = head is engine._model.model.embed_tokens.weight
    assert (
        head.numel() > 0
    ) == tied  # a tied output layer stays plain for the lookup, an untied one is emptied
    again = engine.generate(_requests())
    assert [o.log_probs for o in again] == [o.log_probs for o in first]  # replay is bitwise
    engine._sha256 = None  # computed again, from the weights read back
    assert engine.weights_sha256() == sha
    after = engine.get_weights()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert engine._fast is None and all(p.numel() > 0 for p in [*_layer_weights(engine), head])


@needs_bf16
def test_loads_scrambles_and_releases_of_a_prepacked_engine_keep_every_weight(checkpoint):
    engine = TorchEngine(checkpoint, precision="bf16")
    weights = engine.get_weights()
    first = engine.generate(_requests())
    engine.load_weights({"model.norm.weight": weights["model.norm.weight"]})  # a bucket that leaves the rest
    assert [o.log_probs for o in engine.generate(_requests())] == [o.log_probs for o in first]
    engine.snapshot_and_scramble(seed=3)
    assert not torch.equal(
        engine.get_weights()["model.layers.0.mlp.down_proj.weight"],
        weights["model.layers.0.mlp.down_proj.weight"],
    )
    engine.update_weights(weights, 2)
    assert [o.log_probs for o in engine.generate(_requests())] == [o.log_probs for o in first]
    engine.release_memory()  # from the prepacked state: shapes come from the engine, not the empty parameters
    engine.update_weights(weights, 3)
    assert [o.log_probs for o in engine.generate(_requests())] == [o.log_probs for o in first]


@needs_bf16
def test_prepacked_products_score_as_the_plain_layout_within_bf16(checkpoint, monkeypatch):
    """Both layouts run bf16 products with float32 accumulation; the kernels behind them may round differently
    on different CPUs, so only the bf16 bound is held."""
    packed = TorchEngine(checkpoint, precision="bf16")
    monkeypatch.setattr(engine_module, "prepacked_linear_supported", lambda dtype, device: False)
    plain = TorchEngine(checkpoint, precision="bf16")
    assert plain.health()["linear"] == "torch"
    ids, positions, mask = (
        torch.tensor([[3, 4, 5, 6]]),
        torch.arange(4)[None],
        torch.ones(1, 8, dtype=torch.bool),
    )
    with torch.inference_mode():
        a = torch.log_softmax(packed._decoder(8).prefill(ids, positions, mask), -1)
        b = torch.log_softmax(plain._decoder(8).prefill(ids, positions, mask), -1)
    assert packed._fast is not None and packed._fast.prepacked and plain._fast is not None
    assert not plain._fast.prepacked
    assert (a - b).abs().max() < BF16_LOGP_TOL


def test_fp32_and_cpus_without_bf16_keep_the_plain_layout(base_checkpoint, monkeypatch):
    assert not prepacked_linear_supported(torch.float32, torch.device("cpu"))
    assert TorchEngine(base_checkpoint).health()["linear"] == "torch"
    monkeypatch.setattr(engine_module, "prepacked_linear_supported", lambda dtype, device: False)
    engine = TorchEngine(base_checkpoint, precision="bf16")
    out = engine.generate(_requests(n=2))
    assert engine._fast is not None and not engine._fast.prepacked
    assert all(p.numel() > 0 for p in _layer_weights(engine)) and all(o.response_tokens for o in out)
