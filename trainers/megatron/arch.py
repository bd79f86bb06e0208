"""The architecture numbers of an HF Qwen2 / Qwen3 / Llama checkpoint that the Megatron model and the weight
conversion need, read from its `config.json` (pure Python: no megatron import)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.dropout import describe, dropout_keys

SUPPORTED = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class ModelArch:
    """One decoder-only transformer of the Qwen2/Qwen3/Llama family: pre-RMSNorm, RoPE, GQA, SwiGLU MLP; Qwen3
    adds an RMSNorm over each query and key head (`qk_layernorm`) and an explicit head_dim."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    pad_token_id: int | None  # HF embeds it with padding_idx: its embedding row gets no gradient from inputs

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def padded_vocab(self, tp_size: int) -> int:
        """Vocabulary rows of the Megatron embedding/output layer: the smallest multiple of `tp_size` that
        holds the HF vocabulary (megatron's vocab-parallel layers split the rows evenly over TP ranks).
        The extra rows are zeros and their logits are dropped before any log-prob is taken."""
        return -(-self.vocab_size // tp_size) * tp_size

    def check_tp(self, tp_size: int) -> None:
        """Refuse a tensor-parallel size this model cannot be split into, naming the flag."""
        for what, n in (
            ("attention heads", self.num_heads),
            ("key/value heads", self.num_kv_heads),
            ("MLP hidden size", self.ffn_hidden_size),
        ):
            if n % tp_size:
                raise ValueError(
                    f"--tensor-model-parallel-size {tp_size} must divide the model's {what} ({n})"
                )

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArch:
        """Read an HF `config.json` dict; anything this conversion would silently get wrong is refused."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED:
            raise ValueError(
                f"megatron backend: model_type {model_type!r} is not supported (only {SUPPORTED})"
            )
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"megatron backend: hidden_act {act!r} is not supported (SwiGLU with silu only)")
        if config.get("use_sliding_window"):
            raise ValueError(
                "megatron backend: sliding-window attention (use_sliding_window) is not supported"
            )
        if config.get("mlp_bias") or config.get("attention_bias"):
            raise ValueError(
                "megatron backend: mlp_bias / attention_bias (biases on o_proj and the MLP) are not supported"
            )
        dropout = dropout_keys(config)
        if dropout:  # build_config sets every dropout to 0: a model that drops out would train as another
            raise ValueError(
                f"megatron backend: {describe(dropout)}: the backend builds its models without dropout (the "
                "old-policy log-prob pass and the first train step must see the same forward); set it to 0.0"
            )
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"megatron backend: rope_type {rope_type!r} is not supported (plain RoPE only)")
        # transformers >= 5 keeps the theta in rope_parameters; older configs have a top-level rope_theta
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            model_type=model_type,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            ffn_hidden_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type
            == "qwen2",  # Qwen2: q/k/v biases only; Qwen3, Llama (refused above with any): none
            qk_layernorm=model_type == "qwen3",
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            pad_token_id=None if config.get("pad_token_id") is None else int(config["pad_token_id"]),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelArch:
        """`from_hf_config` of `path/config.json`."""
        return cls.from_hf_config(json.loads((Path(path) / "config.json").read_text()))
