"""HF Qwen2/Qwen3/Llama <-> Megatron GPTModel weight conversion (pure torch: runs without megatron-core).

That the layout is megatron's own is checked against the real GPTModel in test_megatron_trainer.py
(logits equal to the HF model's); here: bitwise round trips, the sharded layout, and the refusals."""

from __future__ import annotations

import pytest
import torch

from tests.megatron_helpers import build_hf_model
from trainers.megatron import convert
from trainers.megatron.arch import ModelArch

CASES = {  # name: (family, tied, vocab, heads, kv_heads)
    "qwen2-tied-gqa-odd-vocab": ("qwen2", True, 31, 4, 2),
    "qwen2-untied-gqa": ("qwen2", False, 30, 4, 2),
    "qwen3-untied-gqa": ("qwen3", False, 30, 4, 2),
    "llama-untied-mha": ("llama", False, 30, 4, 4),
    "llama-tied-gqa": ("llama", True, 31, 4, 2),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_model(request, tmp_path_factory):
    family, tied, vocab, heads, kv = CASES[request.param]
    path = build_hf_model(
        tmp_path_factory.mktemp(request.param),
        family=family,
        tied=tied,
        vocab=vocab,
        heads=heads,
        kv_heads=kv,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return ModelArch.from_pretrained(path), {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tp", [1, 2])
def test_hf_megatron_hf_is_bitwise(hf_model, tp):
    arch, hf = hf_model
    shards = [convert.hf_to_megatron(hf, arch, tp, r) for r in range(tp)]
    assert sorted(shards[0]) == sorted(convert.megatron_names(arch))
    back = convert.megatron_to_hf(shards, arch)
    assert sorted(back) == sorted(hf) == sorted(convert.hf_names(arch))
    for name, tensor in hf.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    if arch.tied_embeddings:  # the export lists lm_head as the embedding, as HF's state_dict does
        assert back["lm_head.weight"] is back["model.embed_tokens.weight"]


def test_bfloat16_round_trip_keeps_dtype_and_bits(hf_model):
    arch, hf = hf_model
    bf16 = {k: v.to(torch.bfloat16) for k, v in hf.items()}
    back = convert.megatron_to_hf([convert.hf_to_megatron(bf16, arch, 2, r) for r in range(2)], arch)
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], v) for k, v in bf16.items())


def test_tensor_parallel_layout(hf_model):
    """Megatron's layout, written out independently of the converter's code."""
    arch, hf = hf_model
    d, hpg, g, f = arch.head_dim, arch.heads_per_group, arch.num_kv_heads, arch.ffn_hidden_size
    ranks = [convert.hf_to_megatron(hf, arch, 2, r) for r in range(2)]
    pre = "model.layers.1."
    q, k, v = (hf[pre + f"self_attn.{x}_proj.weight"] for x in "qkv")
    for r, shard in enumerate(ranks):
        qkv = shard["decoder.layers.1.self_attention.linear_qkv.weight"]
        assert qkv.shape == ((hpg + 2) * d * g // 2, arch.hidden_size)
        for local in range(g // 2):  # each rank holds whole key/value groups, in order
            group = r * g // 2 + local
            rows = qkv[local * (hpg + 2) * d : (local + 1) * (hpg + 2) * d]
            assert torch.equal(rows[: hpg * d], q[group * hpg * d : (group + 1) * hpg * d])
            assert torch.equal(rows[hpg * d : (hpg + 1) * d], k[group * d : (group + 1) * d])
            assert torch.equal(rows[(hpg + 1) * d :], v[group * d : (group + 1) * d])
        fc1 = shard["decoder.layers.1.mlp.linear_fc1.weight"]
        half = slice(r * f // 2, (r + 1) * f // 2)
        gate, up = hf[pre + "mlp.gate_proj.weight"], hf[pre + "mlp.up_proj.weight"]
        assert torch.equal(fc1, torch.cat([gate[half], up[half]]))
        width = arch.num_heads * d  # o_proj's input: every head's output (Qwen3: not the hidden size)
        cols = slice(r * width // 2, (r + 1) * width // 2)
        assert torch.equal(
            shard["decoder.layers.1.self_attention.linear_proj.weight"],
            hf[pre + "self_attn.o_proj.weight"][:, cols],
        )
        assert torch.equal(
            shard["decoder.layers.1.input_layernorm.weight"], hf[pre + "input_layernorm.weight"]
        )
        for x in "qk":  # Qwen3's per-head norms: [head_dim], the same on every rank
            name = f"decoder.layers.1.self_attention.{x}_layernorm.weight"
            assert (name in shard) == arch.qk_layernorm
            if arch.qk_layernorm:
                assert torch.equal(shard[name], hf[pre + f"self_attn.{x}_norm.weight"])
                assert shard[name].shape == (d,)
    embedding = torch.cat([s[convert.EMBEDDING] for s in ranks])
    assert embedding.shape[0] == arch.padded_vocab(2) and embedding.shape[0] % 2 == 0
    assert torch.equal(embedding[: arch.vocab_size], hf["model.embed_tokens.weight"])
    assert not embedding[arch.vocab_size :].any()  # padding rows are zeros


def test_tensor_parallel_split_dims(hf_model):
    arch, _ = hf_model
    dims = {n: convert.tp_split_dim(n, arch) for n in convert.megatron_names(arch)}
    assert dims[convert.EMBEDDING] == 0 and dims[convert.FINAL_NORM] is None
    assert dims["decoder.layers.0.self_attention.linear_proj.weight"] == 1
    assert dims["decoder.layers.0.mlp.linear_fc2.weight"] == 1
    assert dims["decoder.layers.0.pre_mlp_layernorm.weight"] is None
    if arch.qk_layernorm:
        assert dims["decoder.layers.0.self_attention.q_layernorm.weight"] is None
        assert dims["decoder.layers.0.self_attention.k_layernorm.weight"] is None


BASE = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 30,
}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "sliding-window"),
        (
            {"attention_dropout": 0.1},
            "attention_dropout = 0.1: the backend builds its models without dropout",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type 'yarn'"),
        ({"model_type": "llama", "attention_bias": True}, "attention_bias"),
        ({"model_type": "qwen3", "attention_bias": True}, "attention_bias"),  # a bias on o_proj too
    ],
)
def test_architectures_it_would_get_wrong_are_refused(change, needle):
    with pytest.raises(ValueError, match=needle):
        ModelArch.from_hf_config({**BASE, **change})


def test_arch_reads_rope_theta_old_and_new_style_and_checks_tp():
    assert ModelArch.from_hf_config({**BASE, "rope_theta": 1e6}).rope_theta == 1e6
    arch = ModelArch.from_hf_config({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert arch.rope_theta == 5e5 and arch.qkv_bias and arch.head_dim == 8
    assert not ModelArch.from_hf_config({**BASE, "model_type": "llama"}).qkv_bias
    qwen3 = ModelArch.from_hf_config({**BASE, "model_type": "qwen3", "head_dim": 16})
    assert qwen3.qk_layernorm and not qwen3.qkv_bias and qwen3.head_dim == 16
    assert not arch.qk_layernorm
    arch.check_tp(2)
    with pytest.raises(
        ValueError, match="--tensor-model-parallel-size 4 must divide the model's key/value heads"
    ):
        arch.check_tp(4)
