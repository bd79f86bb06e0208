"""Character-level tokenizer for long-arith, padded to 4096 ids.

Contract:
    * ids: ``<pad>``=0, ``<eos>``=1, ``<|user|>``=2, ``<|assistant|>``=3 (tiny-arith's special tokens), then
      the characters ``0123456789+=;``, then ``<|reserved_N|>`` up to ``VOCAB_SIZE`` (4096) ids in all.
    * Every character is one token; nothing is added automatically on encode.
    * ``apply_chat_template([{"role": "user", "content": "12+34"}], tokenize=False,
      add_generation_prompt=True)`` == ``"<|user|>12+34<|assistant|>"``.

Why the reserved tokens: this recipe exists to time the RL step and the engine on realistic shapes, and with 17
real tokens the lm_head and the [tokens, vocab] log-softmax (of sampling, of the trainer's log-probs and of its
loss) would cost nothing, which no real model's do. Real tokenizers carry reserved/unused ids too (Qwen2's
vocabulary is padded past its BPE merges, Llama 3 reserves 250 special tokens); these are never produced from text
(the pre-tokenizer splits text into single characters) and the warm-up teaches the model not to sample them.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from recipes.common import EOS_ID, PAD_ID, SPECIAL_TOKENS, char_tokenizer, tokenizer_fingerprint  # noqa: F401

CHARACTERS = "0123456789+=;"
VOCAB_SIZE = 4096
RESERVED = tuple(f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS) - len(CHARACTERS)))

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "<|assistant|>{{ message['content'] }}<eos>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the long-arith tokenizer (deterministic, offline)."""
    return char_tokenizer(CHARACTERS, CHAT_TEMPLATE, model_max_length=512, reserved=RESERVED)
