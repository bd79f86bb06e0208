"""HF Qwen2/Qwen3/Llama <-> megatron-core GPTModel (local layer spec) weights, tensor-parallel sharded.

Pure data movement (views, cat, split, zero padding), so HF -> Megatron -> HF is bitwise. Works one
parameter at a time, so a caller can stream: build one rank's shard from lazily read HF tensors, or
turn one gathered parameter back into HF tensors, without a second copy of the whole model. The same
functions convert anything shaped like the parameters (e.g. AdamW moments).

Megatron layouts (local spec, no Transformer Engine):
- `self_attention.linear_qkv.weight` is [(heads + 2 * kv_heads) * head_dim, hidden], grouped per key/value
  head: for each group g the rows of its query heads, then its key head, then its value head. TP ranks
  own contiguous runs of whole groups (the bias [..] follows the same rows).
- `mlp.linear_fc1.weight` is [2 * ffn, hidden] = gate rows then up rows, *per TP rank*: rank r holds
  cat(gate_r, up_r) of its own ffn slice.
- column-parallel layers (qkv, fc1, embedding, output layer) split rows; row-parallel layers
  (linear_proj, linear_fc2) split columns; RMSNorm weights are replicated on every TP rank, Qwen3's per-head
  `self_attention.q_layernorm` / `k_layernorm` (HF `q_norm` / `k_norm`, [head_dim]) included.
- the vocabulary is padded with zero rows to `ModelArch.padded_vocab(tp)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from trainers.megatron.arch import ModelArch

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# megatron suffix inside a layer -> (HF suffixes inside model.layers.{i}., how it is split over TP ranks)
_LAYER_PARAMS: dict[str, tuple[tuple[str, ...], str]] = {
    "input_layernorm.weight": (("input_layernorm.weight",), "replicated"),
    "self_attention.linear_qkv.weight": (
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
    ),
    "self_attention.linear_qkv.bias": (
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
    ),
    "self_attention.q_layernorm.weight": (("self_attn.q_norm.weight",), "replicated"),
    "self_attention.k_layernorm.weight": (("self_attn.k_norm.weight",), "replicated"),
    "self_attention.linear_proj.weight": (("self_attn.o_proj.weight",), "columns"),
    "pre_mlp_layernorm.weight": (("post_attention_layernorm.weight",), "replicated"),
    "mlp.linear_fc1.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "gated"),
    "mlp.linear_fc2.weight": (("mlp.down_proj.weight",), "columns"),
}

_QK_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")


def head_local(name: str) -> bool:
    """Whether Megatron parameter `name` is replicated over TP but applied to this rank's heads only (Qwen3's q/k
    layernorm), so its gradient on one TP rank is a part of the whole."""
    return name.endswith(_QK_NORMS)


def megatron_names(arch: ModelArch) -> list[str]:
    """Every parameter name of the Megatron GPTModel for `arch`, in module order."""
    names = [EMBEDDING]
    for i in range(arch.num_layers):
        for suffix in _LAYER_PARAMS:
            if suffix.endswith(".bias") and not arch.qkv_bias:
                continue
            if suffix in _QK_NORMS and not arch.qk_layernorm:
                continue
            names.append(f"decoder.layers.{i}.{suffix}")
    names.append(FINAL_NORM)
    if not arch.tied_embeddings:
        names.append(OUTPUT)
    return names


def hf_sources(name: str, arch: ModelArch) -> tuple[list[str], str]:
    """(HF tensor names that Megatron parameter `name` is made of, its TP split kind)."""
    if name == EMBEDDING:
        return ["model.embed_tokens.weight"], "vocab"
    if name == OUTPUT:
        return ["lm_head.weight"], "vocab"
    if name == FINAL_NORM:
        return ["model.norm.weight"], "replicated"
    m = _LAYER.match(name)
    if m is None or m.group(2) not in _LAYER_PARAMS:
        raise KeyError(f"not a Megatron GPTModel parameter of the local spec: {name!r}")
    hf, kind = _LAYER_PARAMS[m.group(2)]
    return [f"model.layers.{m.group(1)}.{s}" for s in hf], kind


def tp_split_dim(name: str, arch: ModelArch) -> int | None:
    """The dimension Megatron parameter `name` is split along over TP ranks; None when it is replicated."""
    kind = hf_sources(name, arch)[1]
    return None if kind == "replicated" else 1 if kind == "columns" else 0


def hf_names(arch: ModelArch) -> list[str]:
    """The HF state-dict names (what `model.state_dict()` lists, `lm_head.weight` included when tied)."""
    out = [n for name in megatron_names(arch) for n in hf_sources(name, arch)[0]]
    return out + ["lm_head.weight"] if arch.tied_embeddings else out


# ------------------------------------------------------------------------------------------- HF -> Megatron
def _qkv_full(qkv: list[Tensor], arch: ModelArch) -> Tensor:
    """[kv_heads, heads_per_group + 2, head_dim, *rest] from [q, k, v]: each group's query heads, then its
    key and value head."""
    q, k, v = qkv
    rest = q.shape[1:]
    g, hpg, d = arch.num_kv_heads, arch.heads_per_group, arch.head_dim
    return torch.cat(
        [q.reshape(g, hpg, d, *rest), k.reshape(g, 1, d, *rest), v.reshape(g, 1, d, *rest)], dim=1
    )


def to_megatron(
    name: str, hf: Callable[[str], Tensor], arch: ModelArch, tp_size: int = 1, tp_rank: int = 0
) -> Tensor:
    """TP rank `tp_rank`'s shard of Megatron parameter `name`, built from the HF tensors `hf(hf_name)`.

    Shapes: see the module doc (e.g. linear_qkv.weight [(heads + 2 kv_heads) * head_dim / tp, hidden]).
    A tied model's output layer is the embedding, so `name` is never `output_layer.weight` for it.
    """
    sources, kind = hf_sources(name, arch)
    tensors = [hf(s) for s in sources]
    if kind == "replicated":
        return tensors[0].clone()
    if kind == "vocab":
        full = tensors[0]
        rows = arch.padded_vocab(tp_size)
        if rows > full.shape[0]:
            full = torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])
        return full.chunk(tp_size, dim=0)[tp_rank].clone()
    if kind == "columns":
        return tensors[0].chunk(tp_size, dim=1)[tp_rank].clone()
    if kind == "gated":
        gate, up = (t.chunk(tp_size, dim=0)[tp_rank] for t in tensors)
        return torch.cat([gate, up], dim=0)
    full = _qkv_full(tensors, arch)  # kind == "qkv"
    mine = full.chunk(tp_size, dim=0)[tp_rank]  # whole key/value groups per rank
    return mine.reshape(-1, *full.shape[3:]).clone()


def hf_to_megatron(
    hf: Mapping[str, Tensor], arch: ModelArch, tp_size: int = 1, tp_rank: int = 0
) -> dict[str, Tensor]:
    """One TP rank's Megatron state dict from a whole HF state dict (a tied one may lack `lm_head.weight`)."""
    return {name: to_megatron(name, hf.__getitem__, arch, tp_size, tp_rank) for name in megatron_names(arch)}


# ------------------------------------------------------------------------------------------- Megatron -> HF
def to_hf(name: str, shards: Sequence[Tensor], arch: ModelArch) -> dict[str, Tensor]:
    """The HF tensors of Megatron parameter `name` from all its TP shards (in TP rank order).

    A tied model's embedding yields `model.embed_tokens.weight` and `lm_head.weight` as one shared tensor,
    as `model.state_dict()` of the HF model lists them. Vocabulary padding rows are dropped.
    """
    sources, kind = hf_sources(name, arch)
    if kind == "replicated":
        return {sources[0]: shards[0].clone()}
    if kind == "vocab":
        full = torch.cat(list(shards), dim=0)[: arch.vocab_size].clone()
        out = {sources[0]: full}
        if name == EMBEDDING and arch.tied_embeddings:
            out["lm_head.weight"] = full
        return out
    if kind == "columns":
        return {sources[0]: torch.cat(list(shards), dim=1)}
    if kind == "gated":
        halves = [s.chunk(2, dim=0) for s in shards]
        return {sources[0]: torch.cat([h[0] for h in halves]), sources[1]: torch.cat([h[1] for h in halves])}
    rest = shards[0].shape[1:]  # kind == "qkv"
    g, hpg, d = arch.num_kv_heads, arch.heads_per_group, arch.head_dim
    full = torch.cat(list(shards), dim=0).reshape(g, hpg + 2, d, *rest)
    return {
        sources[0]: full[:, :hpg].reshape(g * hpg * d, *rest).clone(),
        sources[1]: full[:, hpg].reshape(g * d, *rest).clone(),
        sources[2]: full[:, hpg + 1].reshape(g * d, *rest).clone(),
    }


def megatron_to_hf(shards: Sequence[Mapping[str, Tensor]], arch: ModelArch) -> dict[str, Tensor]:
    """The whole HF state dict from every TP rank's Megatron state dict (in TP rank order)."""
    out: dict[str, Tensor] = {}
    for name in megatron_names(arch):
        out.update(to_hf(name, [s[name] for s in shards], arch))
    return out
