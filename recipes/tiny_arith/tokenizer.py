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

import hashlib
import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)
CHARACTERS = "0123456789+-= "

PAD_ID = 0
EOS_ID = 1

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


def _vocab() -> dict[str, int]:
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {token: idx for idx, token in enumerate(tokens)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny-arith tokenizer (deterministic, offline)."""
    core = Tokenizer(models.WordLevel(vocab=_vocab(), unk_token=None))
    # Isolate every single character (spaces included) as its own pre-token; the
    # special tokens are matched before pre-tokenization because they are added tokens.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Plain concatenation on decode; the default would join tokens with spaces.
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))

    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[USER_TOKEN, ASSISTANT_TOKEN],
        clean_up_tokenization_spaces=False,
        model_max_length=64,
        # Generation prompts are batched left-padded (decoder-only model); passed here
        # (not set afterwards) so that it survives save_pretrained.
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    assert tok.pad_token_id == PAD_ID and tok.eos_token_id == EOS_ID
    return tok


def tokenizer_fingerprint(tok: PreTrainedTokenizerFast) -> str:
    """sha256 hex over the sorted vocab and the chat template; stable across processes."""
    payload = json.dumps(
        {"vocab": sorted(tok.get_vocab().items()), "chat_template": tok.chat_template},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
