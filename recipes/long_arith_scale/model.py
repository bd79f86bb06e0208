"""The architectures of the long-arith scale recipes.

``long-arith-0.5b`` is Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 attention heads of 64 dims with 2 KV
heads, SwiGLU MLP 4864, tied embeddings, vocabulary 151,936, RMSNorm eps 1e-6, rotary theta 1e6, 32,768 positions,
q/k/v biases (every Qwen2 has them): 494,032,768 parameters.

``long-arith-50m`` keeps the vocabulary, the tied embeddings, the head size (64), the 2 KV heads, the norms and
rotary of the 0.5B and shrinks the rest: hidden 256 (4 heads), 12 layers, MLP 1024 (4x hidden): 50,704,640
parameters, 38,895,616 of them (77%) in the embedding, as in real small LMs with large vocabularies.
"""

from __future__ import annotations

import dataclasses

from transformers import Qwen2Config

from recipes.common import qwen2_config

VOCAB_SIZE = 151_936  # Qwen2's, padded past its BPE merges to a multiple of 128


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Qwen2 architecture and the seed of its random initialisation (all part of the checkpoint's cache key)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 32_768
    tie_word_embeddings: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    model_seed: int = 0


SHAPES: dict[str, ModelShape] = {
    "long-arith-0.5b": ModelShape(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "long-arith-50m": ModelShape(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


def model_config(shape: ModelShape, vocab_size: int = VOCAB_SIZE) -> Qwen2Config:
    """The Qwen2 config of ``shape`` (the recipes' shared special ids, float32, sdpa: recipes.common)."""
    fields = dataclasses.asdict(shape)
    del fields["model_seed"]
    return qwen2_config(vocab_size, **fields)


def num_parameters(shape: ModelShape, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameters of ``shape``'s model, counted from the architecture (a tied lm_head counts once)."""
    h, f = shape.hidden_size, shape.intermediate_size
    kv = shape.num_key_value_heads * (h // shape.num_attention_heads)
    attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v with biases; o without
    layer = attention + 3 * h * f + 2 * h  # gate, up, down; two RMSNorm weights
    embed = vocab_size * h
    head = 0 if shape.tie_word_embeddings else vocab_size * h
    return embed + shape.num_hidden_layers * layer + h + head  # + the final RMSNorm
