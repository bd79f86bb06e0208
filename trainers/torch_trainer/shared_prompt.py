"""The torch trainer's forward when a micro-batch's samples share prompts (a GRPO group repeats its prompt
n_samples_per_prompt times): each distinct prompt runs once, and its keys and values are copied to the rows
of its samples, whose response tokens attend to them. Autograd sums the gradient of every copy back into the
one prompt forward. On tiny-arith the prompts are about two thirds of a micro-batch's tokens.

Qwen2 / Llama-family models only (the block engines.torch_engine.decoder.FastDecoder implements, on the same
HF parameter tensors); trainers.batching.SharedPrompts.build decides from the token counts whether it pays.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainers.batching import SharedPrompts


def supports(model: Any) -> bool:
    """Whether `shared_hidden` computes what `model`'s own forward computes."""
    from engines.torch_engine.decoder import FastDecoder

    return FastDecoder.supports(model)


def shared_hidden(model: Any, sp: SharedPrompts) -> torch.Tensor:
    """Final-norm hidden states predicting each response token, [N, H] in `sp.source` order; differentiable."""
    inner, cfg = model.model, model.config
    h, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    eps = float(cfg.rms_norm_eps)
    g, p = sp.prompt_ids.shape
    b, r = sp.response_ids.shape
    embed = (
        inner.embed_tokens
    )  # its padding_idx (HF: the pad id) gets no gradient, as in the model's own forward
    xp, xr = (
        F.embedding(ids, embed.weight, padding_idx=embed.padding_idx)
        for ids in (sp.prompt_ids, sp.response_ids)
    )
    rope = [inner.rotary_emb(xp, pos) for pos in (sp.prompt_pos, sp.response_pos)]
    (cos_p, sin_p), (cos_r, sin_r) = [(c[:, :, None, :], s[:, :, None, :]) for c, s in rope]
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

    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        bias = (
            None
            if attn.q_proj.bias is None
            else torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        )
        parts = []
        for x, cos, sin, n, length in ((xp, cos_p, sin_p, g, p), (xr, cos_r, sin_r, b, r)):
            qkv = F.linear(F.rms_norm(x, (x.shape[-1],), layer.input_layernorm.weight, eps), w, bias)
            qkv = qkv.view(n, length, h + 2 * kvh, d)
            qk = qkv[:, :, : h + kvh]
            qk = qk * cos + rotate(qk) * sin
            parts.append(
                (
                    qk[:, :, :h].transpose(1, 2),
                    qk[:, :, h:].transpose(1, 2),
                    qkv[:, :, h + kvh :].transpose(1, 2),
                )
            )
        (q_p, k_p, v_p), (q_r, k_r, v_r) = parts
        att_p = F.scaled_dot_product_attention(q_p, k_p, v_p, attn_mask=prompt_mask, enable_gqa=True)
        att_r = F.scaled_dot_product_attention(
            q_r,
            torch.cat([k_p[sp.group], k_r], dim=2),
            torch.cat([v_p[sp.group], v_r], dim=2),
            attn_mask=response_mask,
            enable_gqa=True,
        )
        outs = []
        for x, att, n, length in ((xp, att_p, g, p), (xr, att_r, b, r)):
            x = x + attn.o_proj(att.transpose(1, 2).reshape(n, length, h * d))
            y = F.rms_norm(x, (x.shape[-1],), layer.post_attention_layernorm.weight, eps)
            outs.append(x + mlp.down_proj(F.silu(mlp.gate_proj(y)) * mlp.up_proj(y)))
        xp, xr = outs
    last = xp[:, -1][sp.group][:, None]  # [B, 1, H]: predicts response token 0
    hidden = torch.cat([last, xr], dim=1)  # [B, 1 + R, H]
    hidden = F.rms_norm(hidden, (hidden.shape[-1],), inner.norm.weight, eps)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, sp.source)
