"""The torch trainer's forward when a micro-batch's samples share prompts (a GRPO group repeats its prompt
n_samples_per_prompt times): each distinct prompt runs once, and its keys and values are copied to the rows
of its samples, whose response tokens attend to them. Autograd sums the gradient of every copy back into the
one prompt forward. On tiny-arith the prompts are about two thirds of a micro-batch's tokens.

Qwen2 / Llama-family models only (the block engines.torch_engine.decoder.FastDecoder implements, on the same
HF parameter tensors); trainers.batching.SharedPrompts.build decides from the token counts whether it pays.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from trainers.batching import SharedPrompts
from trainers.recompute import recompute
from trainers.torch_trainer.tied import TiedGrad, tied_embedding


def supports(model: Any) -> bool:
    """Whether `shared_hidden` computes what `model`'s own forward computes."""
    from engines.torch_engine.decoder import FastDecoder

    return FastDecoder.supports(model)


def shared_hidden(
    model: Any,
    sp: SharedPrompts,
    recomputed: frozenset[int] = frozenset(),
    selective: bool = False,
    tied: TiedGrad | None = None,
) -> torch.Tensor:
    """Final-norm hidden states predicting each response token, [N, H] in `sp.source` order; differentiable.
    `recomputed`: layers whose activations are recomputed in the backward (whole layers, or with `selective`
    their attention only: trainers/recompute.py). `tied`: the embedding's gradient goes through it (a tied
    embedding: trainers/torch_trainer/tied.py).

    Every token-wise operation (norms, projections, rotary, MLP) runs on the packed rows, real tokens only: the
    matmuls set the time, and padding every response to the longest would multiply them (on tiny-arith by up to
    two). Only attention unpacks the rows into padded prompts and responses."""
    inner, cfg = model.model, model.config
    h, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    eps = float(cfg.rms_norm_eps)
    g, p = sp.prompt_valid.shape
    b, r = sp.group.shape[0], sp.response_len
    slots = g * p  # the unpacked layout: [G, P] prompts, then [B, R] responses
    # its padding_idx (HF: the pad id) gets no gradient, as in the model's own forward
    embed = inner.embed_tokens
    x = tied_embedding(sp.ids, embed.weight, embed.padding_idx, tied)  # [M, H]
    cos, sin = inner.rotary_emb(x, sp.pos[None])
    cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [M, 1, d]: broadcast over heads
    eye = torch.eye(p, dtype=torch.bool)
    prompt_mask = ((torch.ones(p, p, dtype=torch.bool).tril() & sp.prompt_valid[:, None, :]) | eye)[:, None]
    response_mask = torch.cat(
        [
            sp.prompt_valid[sp.group][:, None, :].expand(b, r, p),
            torch.ones(r, r, dtype=torch.bool).tril().expand(b, r, r),
        ],
        dim=-1,
    )[:, None]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)

    def heads(t: torch.Tensor, n: int, length: int) -> torch.Tensor:  # [n*length, k, d] -> [n, k, length, d]
        return t.reshape(n, length, -1, d).transpose(1, 2)

    def attention(layer: Any, x: torch.Tensor) -> torch.Tensor:
        attn = layer.self_attn
        w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        bias = (
            None
            if attn.q_proj.bias is None
            else torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        )
        qkv = F.linear(F.rms_norm(x, (x.shape[-1],), layer.input_layernorm.weight, eps), w, bias)
        qkv = qkv.view(-1, h + 2 * kvh, d)
        qk = qkv[:, : h + kvh]
        qkv = torch.cat([qk * cos + rotate(qk) * sin, qkv[:, h + kvh :]], dim=1)
        # unpacked: padding slots take the appended zero row (masked out, or outputs never read)
        qkv = torch.cat([qkv, qkv.new_zeros(1, h + 2 * kvh, d)]).index_select(0, sp.unpack)
        q, k, v = qkv[:, :h], qkv[:, h : h + kvh], qkv[:, h + kvh :]
        k_p, v_p = heads(k[:slots], g, p), heads(v[:slots], g, p)
        att_p = F.scaled_dot_product_attention(
            heads(q[:slots], g, p), k_p, v_p, attn_mask=prompt_mask, enable_gqa=True
        )
        att_r = F.scaled_dot_product_attention(
            heads(q[slots:], b, r),
            torch.cat([k_p[sp.group], heads(k[slots:], b, r)], dim=2),
            torch.cat([v_p[sp.group], heads(v[slots:], b, r)], dim=2),
            attn_mask=response_mask,
            enable_gqa=True,
        )
        att = torch.cat(
            [att_p.transpose(1, 2).reshape(slots, h * d), att_r.transpose(1, 2).reshape(b * r, h * d)]
        ).index_select(0, sp.pack)
        return attn.o_proj(att)

    def block(layer: Any, x: torch.Tensor, attention: Any = attention) -> torch.Tensor:
        x = x + attention(layer, x)
        mlp = layer.mlp
        y = F.rms_norm(x, (x.shape[-1],), layer.post_attention_layernorm.weight, eps)
        return x + mlp.down_proj(F.silu(mlp.gate_proj(y)) * mlp.up_proj(y))

    for i, layer in enumerate(inner.layers):
        if i not in recomputed:
            x = block(layer, x)
        elif selective:  # the attention's activations only (Megatron's selective granularity)
            x = block(layer, x, functools.partial(recompute, attention))
        else:
            x = recompute(block, layer, x)
    hidden = x.index_select(0, sp.source)
    return F.rms_norm(hidden, (hidden.shape[-1],), inner.norm.weight, eps)
