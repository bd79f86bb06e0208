"""The long-arith Qwen2: by default (``WarmupSettings``) hidden 192, 4 layers, 4 heads (2 kv), MLP 512, an untied
lm_head over the 4096-id vocabulary, 512 positions, sdpa: 3.2M parameters, half of them in the embedding and the
lm_head, as in small real LMs. Special ids as in tiny-arith (pad=0, eos=1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import Qwen2Config

from recipes.common import build_model, qwen2_config  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from recipes.long_arith.settings import WarmupSettings


def model_config(vocab_size: int, settings: WarmupSettings) -> Qwen2Config:
    """The architecture named by ``settings`` (tests inject a smaller one)."""
    return qwen2_config(
        vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=settings.num_attention_heads,
        num_key_value_heads=settings.num_key_value_heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
