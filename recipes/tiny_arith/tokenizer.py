"""Character-level tokenizer for tiny-arith, built locally with the ``tokenizers`` library.

Contract:
    * ids: ``<pad>``=0, ``<eos>``=1, ``<|user|>``=2, ``<|assistant|>``=3, then the
      characters ``0123456789+-= `` in that order (vocab size 18).
    * Special tokens are atomic (one id each); every other character is one token.
    * Nothing is added automatically on encode (no BOS/EOS).
    * ``apply_chat_template([{"role": "user", "content": "23+45"}], tokenize=False,
      add_generation_prompt=True)`` == ``"<|user|>23+45=<|assistant|>"``.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from recipes.common import (  # noqa: F401  (re-exported: the recipe's token names and ids)
    ASSISTANT_TOKEN,
    EOS_ID,
    EOS_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    USER_TOKEN,
    char_tokenizer,
    tokenizer_fingerprint,
)

CHARACTERS = "0123456789+-= "

# The user turn ends with "=" so that the prompt reads "23+45=" and the model only has
# to emit the digits. Assistant turns (used for SFT/debugging) end with <eos>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "<|user|>{{ message['content'] }}="
    "{% elif message['role'] == 'assistant' %}"
    "<|assistant|>{{ message['content'] }}<eos>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny-arith tokenizer (deterministic, offline)."""
    return char_tokenizer(CHARACTERS, CHAT_TEMPLATE, model_max_length=64)
