"""long-arith's character tokenizer padded to Qwen2's 151,936 ids.

Contract: ids 0-16 are long-arith's (``<pad>``=0, ``<eos>``=1, ``<|user|>``=2, ``<|assistant|>``=3, then
``0123456789+=;``) with its chat template, so a prompt or a response encodes to the same ids under both; then
``<|reserved_N|>`` up to ``VOCAB_SIZE`` ids, which text never encodes to (recipes.long_arith.tokenizer says why
reserved ids are there). ``len(build_tokenizer()) == VOCAB_SIZE == model_config(...).vocab_size``, and the same
holds for the tokenizer saved with the checkpoint as transformers loads it.

Why ``<pad>`` is also the unknown token: transformers loads a tokenizer saved beside a ``qwen2`` config as its
``Qwen2Tokenizer``, which adds an ``<|endoftext|>`` unknown token at id ``VOCAB_SIZE`` unless the saved config
names one, and an id past the model's vocabulary must not exist. A character outside ``0123456789+=;`` (never in
the data) so encodes to ``<pad>`` instead of failing.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from recipes.common import PAD_TOKEN, SPECIAL_TOKENS, char_tokenizer
from recipes.long_arith.tokenizer import CHARACTERS, CHAT_TEMPLATE
from recipes.long_arith_scale.model import VOCAB_SIZE

RESERVED = tuple(f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS) - len(CHARACTERS)))
MODEL_MAX_LENGTH = 32_768  # the models' max_position_embeddings


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tokenizer (deterministic, offline)."""
    return char_tokenizer(
        CHARACTERS, CHAT_TEMPLATE, model_max_length=MODEL_MAX_LENGTH, reserved=RESERVED, unk_token=PAD_TOKEN
    )
