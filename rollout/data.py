"""Prompt data, the way slime reads it: a JSONL or Parquet file, one row per prompt.

A row holds the prompt under `--input-key` (a string, or chat messages `[{"role", "content"}]`), the label
under `--label-key` and a JSON object under `--metadata-key`. With `--apply-chat-template` the prompt is
rendered by the tokenizer's chat template (a string becomes one user message; `--apply-chat-template-kwargs`
and the row's `--tool-key` tools go to the template); without it a string is the prompt text as is. The
engine sees `tokenizer.encode(text, add_special_tokens=False)`: the template adds what the model needs.

Every problem with a file is reported before any work starts, naming the file, the row (JSONL: the line
number) and the key. Loaded sets are cached per process by (path, size, mtime, settings).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from artifacts.store import ArtifactError, ReadLimits, check_declared_sizes, check_list_lengths

SUFFIXES = (".jsonl", ".parquet")
# what a Parquet prompt file may declare before it is read: prompt sets run to millions of rows, where a
# rollout's artifacts hold thousands, so more rows than artifacts.store's default
PROMPT_LIMITS = ReadLimits(rows=1 << 24)


class DataError(ValueError):
    """A prompt file that cannot be used, with the file, row and key named."""


@dataclass(frozen=True)
class Prompt:
    """One prompt as the engine sees it."""

    row: int  # 1-based row of the file (the line number for JSONL)
    text: str  # the rendered prompt text
    tokens: tuple[int, ...]  # what the engine is given
    label: Any  # as the row gave it (None without --label-key)
    metadata: dict[str, Any]  # the row's --metadata-key object
    messages: tuple[dict[str, Any], ...] | None  # the chat messages, when the template rendered them


@dataclass(frozen=True)
class PromptSet:
    """The usable prompts of one file."""

    path: str
    sha256: str
    prompts: tuple[Prompt, ...]
    rows: int  # rows in the file
    dropped_long: int  # rows dropped by --rollout-max-prompt-len


@dataclass(frozen=True)
class Keys:
    """How to read a row and render its prompt (the data flags, as one hashable value)."""

    input_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str
    apply_chat_template: bool
    chat_template_kwargs: str  # JSON text of --apply-chat-template-kwargs (hashable)
    max_prompt_len: int | None


def read_rows(path: str | Path, flag: str) -> list[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of every row of a .jsonl or .parquet file; DataError naming line or row."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{flag} {path}: no such file")
    if p.suffix not in SUFFIXES:
        raise DataError(f"{flag} {path}: unsupported file type {p.suffix!r}; use one of {SUFFIXES}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(p)  # (read_table would import pyarrow.dataset and pandas)
            check_declared_sizes(path, parquet, PROMPT_LIMITS)  # before decoding the data into memory
            table = parquet.read()
            check_list_lengths(path, table, PROMPT_LIMITS)
        except ArtifactError as e:
            raise DataError(f"{flag} {e}") from None
        except Exception as e:  # ArrowInvalid, OSError: a file that is not Parquet
            raise DataError(f"{flag} {path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
        return list(enumerate(table.to_pylist(), start=1))
    out = []
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{flag} {path}: not UTF-8 text ({e})") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{flag} {path} line {n}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{flag} {path} line {n}: expected a JSON object, got {type(row).__name__}")
        out.append((n, row))
    return out


def _messages(value: Any, where: str, keys: Keys) -> list[dict[str, Any]] | None:
    """The row's prompt as chat messages (None: a plain string used as is)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if keys.apply_chat_template else None
    if isinstance(value, list):
        if not keys.apply_chat_template:
            raise DataError(
                f"{where}: --input-key {keys.input_key!r} holds chat messages; add --apply-chat-template "
                f"to render them"
            )
        for i, m in enumerate(value):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise DataError(
                    f"{where}: --input-key {keys.input_key!r} message {i} is not a {{role, content}} "
                    f"object: {str(m)[:80]}"
                )
        return [dict(m) for m in value]
    raise DataError(
        f"{where}: --input-key {keys.input_key!r} must be a string or a list of chat messages, "
        f"got {type(value).__name__}"
    )


def _metadata(row: dict[str, Any], where: str, keys: Keys) -> dict[str, Any]:
    value = row.get(keys.metadata_key)
    if value is None:
        return {}
    if isinstance(value, str):  # Parquet files often store it as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DataError(
                f"{where}: --metadata-key {keys.metadata_key!r} is a string that is not JSON"
            ) from None
    if not isinstance(value, dict):
        raise DataError(
            f"{where}: --metadata-key {keys.metadata_key!r} must be a JSON object, got {type(value).__name__}"
        )
    return value


def load_prompts(path: str, tokenizer: Any, keys: Keys, flag: str = "--prompt-data") -> PromptSet:
    """Read, render, tokenise and filter every row (cached by file identity and settings)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{flag} {path}: no such file")
    stat = p.stat()
    return _load(str(p.resolve()), stat.st_size, stat.st_mtime_ns, tokenizer, keys, flag)


@lru_cache(maxsize=16)
def _load(path: str, size: int, mtime: int, tokenizer: Any, keys: Keys, flag: str) -> PromptSet:
    from artifacts.atomic import sha256_file

    kwargs = json.loads(keys.chat_template_kwargs)
    rows = read_rows(path, flag)
    if not rows:
        raise DataError(f"{flag} {path}: the file has no rows")
    rendered = []
    for n, row in rows:
        where = f"{flag} {path} {'line' if path.endswith('.jsonl') else 'row'} {n}"
        if keys.input_key not in row:
            raise DataError(f"{where}: no key {keys.input_key!r} (--input-key); the row has {sorted(row)}")
        if keys.label_key is not None and keys.label_key not in row:
            raise DataError(f"{where}: no key {keys.label_key!r} (--label-key); the row has {sorted(row)}")
        messages = _messages(row[keys.input_key], where, keys)
        if messages is None:
            text = row[keys.input_key]
        else:
            tools = row.get(keys.tool_key)
            if isinstance(tools, str):
                try:
                    tools = json.loads(tools)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{where}: --tool-key {keys.tool_key!r} is a string that is not JSON ({e.msg} at "
                        f"column {e.colno})"
                    ) from None
            try:
                text = tokenizer.apply_chat_template(
                    messages, tools=tools or None, tokenize=False, add_generation_prompt=True, **kwargs
                )
            except Exception as e:  # no template, a template error, unknown kwargs
                raise DataError(f"{where}: the chat template failed: {type(e).__name__}: {e}") from None
        rendered.append((n, row, messages, text, _metadata(row, where, keys)))
    # one batched call: the same ids as encoding each text on its own, several times faster
    token_lists = tokenizer([t for _, _, _, t, _ in rendered], add_special_tokens=False)["input_ids"]
    prompts, dropped = [], 0
    for (n, row, messages, text, metadata), tokens in zip(rendered, token_lists, strict=True):
        if not tokens:  # an engine cannot generate from nothing: no position to start from
            where = f"{flag} {path} {'line' if path.endswith('.jsonl') else 'row'} {n}"
            raise DataError(
                f"{where}: --input-key {keys.input_key!r}: the prompt {text[:60]!r} encodes to no tokens "
                "(empty, or no character the tokenizer knows)"
            )
        if keys.max_prompt_len is not None and len(tokens) > keys.max_prompt_len:
            dropped += 1
            continue
        prompts.append(
            Prompt(
                row=n,
                text=text,
                tokens=tuple(tokens),
                label=row[keys.label_key] if keys.label_key is not None else None,
                metadata=metadata,
                messages=tuple(messages) if messages is not None else None,
            )
        )
    if not prompts:
        raise DataError(
            f"{flag} {path}: no prompts left: all {len(rows)} are longer than --rollout-max-prompt-len "
            f"{keys.max_prompt_len} tokens"
        )
    return PromptSet(
        path=path, sha256=sha256_file(path), prompts=tuple(prompts), rows=len(rows), dropped_long=dropped
    )


# -- which prompts a rollout takes -------------------------------------------------------------------------
def prompts_for_rollout(
    prompts: tuple[Prompt, ...] | list[Prompt], batch_size: int, rollout_id: int, seed: int, shuffle: bool
) -> list[Prompt]:
    """Rollout `rollout_id`'s prompts: the next `batch_size` of the visiting order, epochs rolling over.
    The order is the file's, or with `shuffle` a per-epoch permutation seeded by `seed + epoch`."""
    out = []
    for k in range(rollout_id * batch_size, (rollout_id + 1) * batch_size):
        epoch, pos = divmod(k, len(prompts))
        out.append(prompts[_epoch_order(len(prompts), seed + epoch)[pos] if shuffle else pos])
    return out


@lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return tuple(order)


_TOKENIZERS: dict[str, Any] = {}  # checkpoint dir -> its tokenizer, loaded once per process
_TOKENIZER_CLASSES: dict[str, type] = {}  # checkpoint dir -> the class another process loaded it as


def tokenizer_at(checkpoint: str) -> Any:
    """The tokenizer of an HF checkpoint dir (loaded once per process: with `AutoTokenizer`, or with the class
    `use_tokenizer_class` named); DataError naming the dir when it does not load."""
    if checkpoint not in _TOKENIZERS:
        loader: Any = _TOKENIZER_CLASSES.get(checkpoint)  # a PreTrainedTokenizerBase subclass
        if loader is None:
            from transformers import AutoTokenizer

            loader = AutoTokenizer
        try:
            _TOKENIZERS[checkpoint] = loader.from_pretrained(checkpoint)
        except (OSError, ValueError) as e:  # a damaged tokenizer file: the JSON error alone names no file
            raise DataError(
                f"--hf-checkpoint {checkpoint}: its tokenizer does not load ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]})"
            ) from None
    return _TOKENIZERS[checkpoint]


def use_tokenizer_class(checkpoint: str, cls: type) -> None:
    """Load `checkpoint`'s tokenizer with `cls`, the class another process's `tokenizer_at(checkpoint)` resolved,
    instead of through `AutoTokenizer`: resolving imports torch and transformers' configuration code (~0.15 GiB
    and seconds of CPU in a process that runs no model, such as the rollout actor); `cls` imports only its own
    module."""
    _TOKENIZER_CLASSES[checkpoint] = cls


def loaded_tokenizer_classes(checkpoint: str | None) -> dict[str, type]:
    """{checkpoint: its tokenizer's class} to hand to another process (`use_tokenizer_class`), where this process
    has loaded that tokenizer and its class is one of transformers' own; else {} (nothing is loaded here), and
    the other process resolves its own. A class travels as its module and name, a few hundred bytes: the
    tokenizer itself pickles to megabytes at a 150k-id vocabulary, which Ray keeps in its object store, and an
    actor that Ray restarts must not depend on that. A class of a checkpoint's own code (`transformers_modules`)
    is never handed over: its module imports only where transformers has set up that checkpoint's code."""
    tok = None if checkpoint is None else _TOKENIZERS.get(checkpoint)
    if checkpoint is None or tok is None or not type(tok).__module__.startswith("transformers."):
        return {}
    return {checkpoint: type(tok)}
