"""Tiny Qwen2 (~0.3M parameters) for tiny-arith.

Contract: ``model_config(vocab_size)`` returns the fixed architecture; special ids come
from ``recipes.tiny_arith.tokenizer`` (pad=0, eos=1; there is no separate BOS token, so
``bos_token_id`` is the eos id, as in the Qwen2 family). ``build_model(config, seed)`` is
bit-for-bit deterministic for a given seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import Qwen2Config

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

from recipes.tiny_arith.tokenizer import EOS_ID, PAD_ID

# "sdpa": measured on the 2-core dev box (batch 64, seq 12, forward+backward+AdamW), it
# ties "eager" with 1 thread (~53-62 ms vs ~60-65 ms per step) and is clearly faster with
# 2 threads under background load (~70-155 ms vs ~240-390 ms per step).
ATTN_IMPLEMENTATION = "sdpa"


def model_config(vocab_size: int) -> Qwen2Config:
    """Config of the tiny Qwen2: hidden 96, 3 layers, 4 heads (2 kv), MLP 256, tied embeddings."""
    return Qwen2Config(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        use_sliding_window=False,
        use_cache=True,
        # transformers >= 5 names this field ``dtype`` (formerly ``torch_dtype``).
        dtype="float32",
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=EOS_ID,
        attn_implementation=ATTN_IMPLEMENTATION,
    )


def build_model(config: Qwen2Config, seed: int) -> Qwen2ForCausalLM:
    """Freshly initialised model; the init depends only on ``config`` and ``seed``.

    The caller's global torch RNG state is left untouched.
    """
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = ATTN_IMPLEMENTATION
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = EOS_ID
    return model.to(torch.float32)  # type: ignore[arg-type]
