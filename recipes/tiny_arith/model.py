"""Tiny Qwen2 (~0.3M parameters) for tiny-arith.

Contract: ``model_config(vocab_size)`` returns the fixed architecture; special ids come
from ``recipes.tiny_arith.tokenizer`` (pad=0, eos=1; there is no separate BOS token, so
``bos_token_id`` is the eos id, as in the Qwen2 family). ``build_model(config, seed)`` is
bit-for-bit deterministic for a given seed.
"""

from __future__ import annotations

from transformers import Qwen2Config

from recipes.common import ATTN_IMPLEMENTATION, build_model, qwen2_config  # noqa: F401  (re-exported)


def model_config(vocab_size: int) -> Qwen2Config:
    """Config of the tiny Qwen2: hidden 96, 3 layers, 4 heads (2 kv), MLP 256, tied embeddings."""
    return qwen2_config(
        vocab_size,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
