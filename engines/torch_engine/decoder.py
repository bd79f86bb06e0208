"""The model step of the embedded engine: prefill a left-padded batch, then decode one token per row.

Two implementations of one small interface (`Decoder`):
  `FastDecoder` runs Qwen2 / Llama-family models (the architectures rollflow's recipes and most small
      RL bases use) on the HF model's own parameter tensors with a preallocated KV cache: no cache
      concatenation per token, q/k/v and gate/up each one matmul, rotary as one small matmul, one
      fused RMSNorm op. Per decode step it issues ~12 torch ops per layer where HF's module tree
      issues ~40: on a small model the Python cost per op is the same order as the arithmetic.
  `HFDecoder` calls the HF model with a `DynamicCache`; it runs any causal LM.
Both can drop finished rows from the batch (`keep`), so a batch's cost follows its live rows
rather than its longest one.

Tensor shapes: B rows, W prompt width (left padded), L = W + max new tokens, V vocab.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers import DynamicCache

# model_type -> the family FastDecoder implements (same block: RMSNorm, rotary GQA attention, SwiGLU MLP)
_FAST_TYPES = frozenset({"qwen2", "llama"})


class Decoder(Protocol):
    """One batch's model state: the KV cache of its live rows."""

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts. ids, positions: [B, W] long; key_mask: [B, L] bool (False = left padding).
        Returns the logits of each row's last prompt token, [B, V] float32 (as `decode` returns them)."""
        ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row. tokens, positions: [B] long. Returns the next logits, [B, V] float32 (a
        decoder may return them in a buffer of its own, valid until its next call: the caller may write it)."""
        ...

    def keep(self, rows: torch.Tensor) -> None:
        """Go on with these rows of the current batch (indices into it; a row may be repeated)."""
        ...


def prepacked_linear_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN's prepacked linear serves `dtype` here: bfloat16 on a CPU with AVX512-BF16 or AMX."""
    return (
        dtype == torch.bfloat16
        and device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def _prepacked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, w, bias) with `weight` in oneDNN's prepacked layout (`_pack`)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] reordered into oneDNN's blocked layout for few-row products: a decode step multiplies a
    handful of rows by every weight, and the plain layout is re-blocked on every call."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 8)


class FastWeights:
    """The HF model's parameters rearranged for `FastDecoder` (fused q/k/v and gate/up, the rotary
    tables). Rebuilt by the engine whenever its weights change. The fused tensors are the only copy: the
    model's q/k/v and gate/up parameters are rebound to views (row slices) of them, so loading a weight into
    the model writes the fused tensor and the model is not held twice.

    `prepack` (where `prepacked_linear_supported`): each layer's four matrices and the output layer are held only in
    oneDNN's prepacked layout, and the model's parameters behind them are left empty until `unpack` puts the weights
    back. A tied output layer is the embedding, whose lookup needs the plain layout: its prepacked copy is a second
    one, dropped by `unpack`. Anything that reads or writes the model's weights must call `unpack` first (the
    engine does)."""

    def __init__(self, model: Any, max_positions: int, prepack: bool = False) -> None:
        cfg = model.config
        inner = model.model
        self.heads: int = cfg.num_attention_heads
        self.kv_heads: int = cfg.num_key_value_heads
        self.head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.embed: torch.Tensor = inner.embed_tokens.weight
        self.final_norm: torch.Tensor = inner.norm.weight
        self.linear = _prepacked_linear if prepack else F.linear
        # what `unpack` puts back: each prepacked matrix, the parameters it holds (in row order) and their rows
        self._held: list[tuple[torch.Tensor, list[torch.Tensor], list[int]]] = []
        head = model.lm_head.weight
        if not prepack:
            self.lm_head: torch.Tensor = head
        elif head is self.embed:  # tied: the lookup needs the plain layout, so the product gets its own copy
            self.lm_head = _pack(head.data)
        else:
            self.lm_head = self._matrix([head], prepack)
        # per layer: input norm, q|k|v weight, q|k|v bias (None for Llama), o weight, post-attention norm,
        # gate|up weight, down weight
        self.layers: list[
            tuple[
                torch.Tensor,
                torch.Tensor,
                torch.Tensor | None,
                torch.Tensor,
                torch.Tensor,
                torch.Tensor,
                torch.Tensor,
            ]
        ] = []
        with torch.no_grad():
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv_bias = None
                if attn.q_proj.bias is not None:
                    qkv_bias = _fused([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                self.layers.append(
                    (
                        layer.input_layernorm.weight,
                        self._matrix([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], prepack),
                        qkv_bias,
                        self._matrix([attn.o_proj.weight], prepack),
                        layer.post_attention_layernorm.weight,
                        self._matrix([mlp.gate_proj.weight, mlp.up_proj.weight], prepack),
                        self._matrix([mlp.down_proj.weight], prepack),
                    )
                )
            # HF's own rotary module, evaluated once for every position this engine can reach
            pos = torch.arange(max_positions, device=self.embed.device)[None, :]
            cos, sin = inner.rotary_emb(self.embed[:1], pos)
            self.cos, self.sin = cos[0], sin[0]  # [P, head_dim]
            half = self.head_dim // 2
            # rotate_half(x) = x @ rot: (x1, x2) -> (-x2, x1); entries 0/+-1, so the product is exact
            rot = torch.zeros(self.head_dim, self.head_dim, dtype=self.embed.dtype, device=self.embed.device)
            rot[half:, :half] = -torch.eye(half)
            rot[:half, half:] = torch.eye(half)
            self.rot = rot

    @property
    def prepacked(self) -> bool:
        """Whether the model's layer matrices are held here, prepacked, and not in the model."""
        return bool(self._held)

    def _matrix(self, params: list[torch.Tensor], prepack: bool) -> torch.Tensor:
        """The parameters as one [sum of rows, in] matrix: plain, each parameter rebound to its slice of it; or
        prepacked, each parameter left empty (its rows kept for `unpack`)."""
        if not prepack:
            return params[0] if len(params) == 1 else _fused(params)
        packed = _pack(torch.cat(params) if len(params) > 1 else params[0].data)
        self._held.append((packed, params, [p.shape[0] for p in params]))
        for p in params:
            p.data = p.data.new_empty(0)
        return packed

    @torch.no_grad()
    def unpack(self) -> None:
        """Give the model its layer matrices back in the plain layout (bitwise the weights that were packed);
        this object is then of no further use. A no-op unless `prepacked`."""
        if not self._held:
            return
        self.layers, self.lm_head = [], self.embed  # a tied output layer's prepacked copy is dropped
        while self._held:  # one matrix at a time: each prepacked copy is freed as its plain one is made
            packed, params, rows = self._held.pop()
            _rebind(packed.to_dense(), params, rows)
            del packed


def _fused(params: list[torch.Tensor]) -> torch.Tensor:
    """The parameters concatenated along dim 0, each then rebound to its (contiguous) slice of the result, which
    frees its own storage."""
    fused = torch.cat(params)
    _rebind(fused, params)
    return fused


def _rebind(fused: torch.Tensor, params: list[torch.Tensor], rows: list[int] | None = None) -> None:
    """Rebind each parameter to its (contiguous) slice of `fused` along dim 0 (`rows` each, or its own first
    dimension), which frees its own storage."""
    start = 0
    for p, n in zip(params, rows or [p.shape[0] for p in params], strict=True):
        p.data = fused[start : start + n]
        start += n


class FastDecoder:
    """Qwen2 / Llama-family forward on `FastWeights` with a preallocated [B, kv_heads, L, head_dim] cache."""

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether this class computes what `model`'s own forward computes."""
        cfg = model.config
        rope = getattr(cfg, "rope_parameters", None) or {}
        return (
            cfg.model_type in _FAST_TYPES
            and getattr(cfg, "hidden_act", "silu") == "silu"
            and not getattr(cfg, "use_sliding_window", False)
            and rope.get("rope_type", "default") == "default"
            and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "pretraining_tp", 1) == 1
            and (cfg.model_type != "llama" or not getattr(cfg, "attention_bias", False))
        )

    def __init__(self, w: FastWeights, length: int) -> None:
        self.w, self.length = w, length
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, allocated by prefill
        self.filled = 0  # cache slots written so far (the same for every row: left padding aligns them)
        self.key_mask: torch.Tensor | None = None  # [B, 1, 1, L] bool
        self._logits: torch.Tensor | None = None  # float32 [B, V] that a low-precision model's logits go to

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        batch, width = ids.shape
        shape = (batch, self.w.kv_heads, self.length, self.w.head_dim)
        # slots past `filled` are never read (every attention slices [:filled]): no need to zero them
        self.kv = [(self.w.embed.new_empty(shape), self.w.embed.new_empty(shape)) for _ in self.w.layers]
        self.key_mask = key_mask[:, None, None, :]
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        # a padding query attends to itself only: an all-False row would give NaN, and NaN values at
        # padding positions would poison real rows through 0 * NaN in attention's weighted sum
        mask = (causal & key_mask[:, None, None, :width]) | torch.eye(
            width, dtype=torch.bool, device=ids.device
        )
        return self._forward(ids, positions, mask)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert self.key_mask is not None
        return self._forward(tokens[:, None], positions[:, None], self.key_mask[..., : self.filled + 1])

    def keep(self, rows: torch.Tensor) -> None:
        def select(cache: torch.Tensor) -> torch.Tensor:
            out = cache.new_empty((rows.numel(), *cache.shape[1:]))
            out[:, :, : self.filled] = cache[rows, :, : self.filled]  # only the slots written so far
            return out

        self.kv = [(select(k), select(v)) for k, v in self.kv]
        assert self.key_mask is not None
        self.key_mask = self.key_mask.index_select(0, rows)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, positions: [B, T]; mask: [B, 1, T, filled + T] bool. Logits of the last position, [B, V]."""
        w = self.w
        b, t = ids.shape
        h, kvh, d = w.heads, w.kv_heads, w.head_dim
        start, end = self.filled, self.filled + t
        cos, sin = w.cos[positions][:, :, None, :], w.sin[positions][:, :, None, :]  # [B, T, 1, d]
        x = F.embedding(ids, w.embed)
        for (ln1, qkv_w, qkv_b, o_w, ln2, gate_up_w, down_w), (kc, vc) in zip(w.layers, self.kv, strict=True):
            qkv = w.linear(F.rms_norm(x, ln1.shape, ln1, w.eps), qkv_w, qkv_b).view(b, t, h + 2 * kvh, d)
            qk = qkv[:, :, : h + kvh]
            qk = qk * cos + (qk @ w.rot) * sin
            kc[:, :, start:end] = qk[:, :, h:].transpose(1, 2)
            vc[:, :, start:end] = qkv[:, :, h + kvh :].transpose(1, 2)
            q = qk[:, :, :h].transpose(1, 2)
            if kc.dtype == torch.float32:
                att = F.scaled_dot_product_attention(
                    q, kc[:, :, :end], vc[:, :, :end], attn_mask=mask, enable_gqa=True
                )
            else:
                att = grouped_attention(q, kc[:, :, :end], vc[:, :, :end], mask)
            x = x + w.linear(att.transpose(1, 2).reshape(b, t, h * d), o_w)
            gate, up = w.linear(F.rms_norm(x, ln2.shape, ln2, w.eps), gate_up_w).chunk(2, dim=-1)
            x = x + w.linear(F.silu(gate) * up, down_w)
        self.filled = end
        last = F.rms_norm(x[:, -1], w.final_norm.shape, w.final_norm, w.eps)
        logits = w.linear(last, w.lm_head)
        if logits.dtype == torch.float32:
            return logits
        # float32 in a buffer kept for the next steps: a fresh [B, V] each step would be a fresh mapping (large
        # allocations are mmap'd) whose pages all fault in on first touch
        if self._logits is None or self._logits.shape[0] < b:
            self._logits = torch.empty((b, logits.shape[-1]), dtype=torch.float32, device=logits.device)
        return self._logits[:b].copy_(logits)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) for low-precision (bfloat16) caches,
    as two batched matmuls with the softmax in float32: torch's CPU attention kernel is an order of magnitude slower
    in bfloat16 than in float32 for the one-token queries of decoding, these matmuls are not.

    q: [B, h, T, d]; k, v: [B, kvh, L, d] (query head i reads key/value head i // (h / kvh)); mask: [B, 1, T, L]
    bool, True = attend. Returns [B, h, T, d] in q's dtype."""
    b, h, t, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    scores = (q.reshape(b, kvh, g * t, d) @ k.transpose(-1, -2)).float().mul_(d**-0.5)
    scores = scores.view(b, kvh, g, t, -1).masked_fill_(~mask[:, :, None], float("-inf"))
    weights = torch.softmax(scores.view(b, kvh, g * t, -1), dim=-1).to(v.dtype)
    return (weights @ v).view(b, h, t, d)


class HFDecoder:
    """Any HF causal LM through its own forward and a `DynamicCache`."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = DynamicCache()
        self.key_mask: torch.Tensor | None = None  # [B, L] long
        self.filled = 0

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        self.key_mask = key_mask.long()
        self.filled = ids.shape[1]
        out = self.model(
            input_ids=ids,
            attention_mask=self.key_mask[:, : self.filled],
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert self.key_mask is not None
        self.filled += 1
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.key_mask[:, : self.filled],
            position_ids=positions[:, None],
            cache=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1, :].float()

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        assert self.key_mask is not None
        self.key_mask = self.key_mask.index_select(0, rows)
