"""What the recipes share and that needs no torch: the model cache's location, character-level tokenizers,
fingerprints, prompt files and response cleaning. (The warm-up machinery, which needs torch, is in
`recipes.warmup`.)"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

if TYPE_CHECKING:
    from transformers import Qwen2Config, Qwen2ForCausalLM

CACHE_ENV_VAR = "ROLLFLOW_CACHE_DIR"
DONE_MARKER = "DONE"  # written last into a checkpoint dir: the dir is complete

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, EOS_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)
PAD_ID = 0
EOS_ID = 1


# "sdpa": it ties "eager" on one thread and is faster on two under background load (bench/HISTORY.md).
ATTN_IMPLEMENTATION = "sdpa"


def qwen2_config(vocab_size: int, **architecture: Any) -> Qwen2Config:
    """A recipe's Qwen2 config: ``architecture`` (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, max_position_embeddings, tie_word_embeddings) plus what every
    recipe shares: no dropout or sliding window, float32, the special ids of ``SPECIAL_TOKENS`` (there is no
    separate BOS token, so ``bos_token_id`` is the eos id, as in the Qwen2 family), sdpa attention."""
    from transformers import Qwen2Config  # transformers' configuration code imports torch

    return Qwen2Config(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        **architecture,
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
    """Freshly initialised float32 model; the init depends only on ``config`` and ``seed``.

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


def default_cache_dir() -> pathlib.Path:
    """``$ROLLFLOW_CACHE_DIR`` if set, else ``~/.cache/rollflow``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "rollflow"


def format_prompt(tok: PreTrainedTokenizerBase, question: str) -> str:
    """Chat-formatted generation prompt of one user turn."""
    return tok.apply_chat_template(  # type: ignore[return-value]
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def char_tokenizer(
    characters: str,
    chat_template: str,
    model_max_length: int,
    reserved: Sequence[str] = (),
    unk_token: str | None = None,
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids ``SPECIAL_TOKENS`` (pad=0, eos=1, user, assistant), then one id per
    character of ``characters``, then ``reserved`` (multi-character names the pre-tokenizer never produces, so
    they are never encoded from text; they only make the vocabulary larger). Deterministic and offline; nothing
    is added on encode; decoding concatenates. ``unk_token`` (one of ``SPECIAL_TOKENS``) is what a character
    outside ``characters`` encodes to; None: encoding one is an error."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if unk_token is not None and unk_token not in SPECIAL_TOKENS:
        raise ValueError(f"unk_token {unk_token!r} is not one of {SPECIAL_TOKENS}")
    vocab = {token: idx for idx, token in enumerate([*SPECIAL_TOKENS, *characters, *reserved])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk_token))
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
        **({"unk_token": unk_token} if unk_token is not None else {}),
        additional_special_tokens=[USER_TOKEN, ASSISTANT_TOKEN],
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        # Generation prompts are batched left-padded (decoder-only model); passed here
        # (not set afterwards) so that it survives save_pretrained.
        padding_side="left",
    )
    tok.chat_template = chat_template
    assert tok.pad_token_id == PAD_ID and tok.eos_token_id == EOS_ID
    return tok


def tokenizer_fingerprint(tok: PreTrainedTokenizerFast) -> str:
    """sha256 hex over the sorted vocab and the chat template; stable across processes."""
    payload = json.dumps(
        {"vocab": sorted(tok.get_vocab().items()), "chat_template": tok.chat_template},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def checkpoint_fingerprint(
    recipe_version: int, settings: object, model_config: dict[str, Any], tok: PreTrainedTokenizerFast
) -> str:
    """Short hash naming a recipe's checkpoint directory: the recipe version, the warm-up settings (a dataclass),
    the model config (as a dict) and the tokenizer."""
    import dataclasses

    config = dict(model_config)
    # The library version does not change the architecture; keep it out of the key.
    config.pop("transformers_version", None)
    payload = json.dumps(
        {
            "recipe_version": recipe_version,
            "settings": dataclasses.asdict(settings),  # type: ignore[call-overload]
            "model_config": config,
            "tokenizer": tokenizer_fingerprint(tok),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def clean_response(response: str) -> str:
    """The response stripped of surrounding whitespace and trailing ``<eos>``/``<pad>`` tokens (text after an
    ``<eos>`` that is not trailing stays: rollouts are expected to stop at ``<eos>``)."""
    text = response.strip()
    stripped = True
    while stripped:
        stripped = False
        for special in (EOS_TOKEN, PAD_TOKEN):
            if text.endswith(special):
                text = text[: -len(special)].rstrip()
                stripped = True
    return text


def prompt_rows(problems: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Problems as prompt-data rows: chat messages under "prompt", the answer under "label"."""
    return [{"prompt": [{"role": "user", "content": p["question"]}], "label": p["label"]} for p in problems]


def write_prompt_files(
    root: pathlib.Path, sources: dict[str, Callable[[], list[dict[str, str]]]]
) -> dict[str, pathlib.Path]:
    """``<root>/<split>.parquet`` of ``prompt_rows(sources[split]())`` for each split, each written once,
    atomically; they are read like any `--prompt-data` file (`--input-key prompt --label-key label
    --apply-chat-template`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from artifacts.atomic import atomic_path

    files = {split: root / f"{split}.parquet" for split in sources}
    for split, path in files.items():
        if not path.is_file():
            with atomic_path(path) as tmp:
                pq.write_table(pa.Table.from_pylist(prompt_rows(sources[split]())), tmp)
    return files
