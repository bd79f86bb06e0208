"""Stop conditions and the chat-template check.

Stops: the tokenizer's EOS (and the model's generation_config eos ids) and the chat template's end-of-turn
token stop every response. `--rollout-stop-token-ids` adds ids. A `--rollout-stop` string that is one token
of the tokenizer becomes a stop id. A longer one is matched on the decoded text after generation; the
response is cut after the token that completes it.

The check runs as `rollflow check-template`, and once at the start of every run. It renders a few prompts the
way the engine gets them, and the full prompt + response turn the way a trainer scores a conversation. It
reports the first token where the two disagree, the loss mask of the assistant turn, whether the turn's
end-of-turn token is a stop id, and whether `add_generation_prompt` changes the render.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Stops:
    """What ends a response: token ids (checked by the engine) and strings (matched on decoded text)."""

    ids: tuple[int, ...]
    strings: tuple[str, ...]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(tokenizer.added_tokens_decoder)  # ChatML's <|im_end|> and friends are added tokens
    return ids


def _generation_eos(checkpoint: str | None) -> list[int]:
    """eos_token_id of the checkpoint's generation_config.json (an int or a list), if any."""
    if not checkpoint:
        return []
    path = Path(checkpoint) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


def end_of_turn(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> int | None:
    """The token that closes an assistant turn in the chat template: the first token rendered after the
    assistant's content, when it is a special token. None without a template, or when the turn ends with
    ordinary text, which then needs a --rollout-stop string."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    probe = _probe_text(tokenizer)
    try:
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": probe}, {"role": "assistant", "content": probe}],
            tokenize=False,
            **(chat_template_kwargs or {}),
        )
    except Exception:  # a template that cannot render an assistant turn: no end-of-turn to find
        return None
    at = full.rfind(probe)
    if at < 0:
        return None
    after = tokenizer.encode(full[at + len(probe) :], add_special_tokens=False)
    return after[0] if after and after[0] in _special_ids(tokenizer) else None


def _probe_text(tokenizer: Any) -> str:
    """A short content string the tokenizer can encode (character-level vocabularies have no letters)."""
    for text in ("hello", "1", "a"):
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except Exception:  # a word-level vocabulary without an unknown token raises on text it lacks
            continue
        if ids and tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text:
            return text
    vocab = [
        t
        for t, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        if i not in _special_ids(tokenizer)
    ]
    return vocab[0] if vocab else "x"


def resolve_stops(
    tokenizer: Any,
    checkpoint: str | None,
    stop_strings: list[str] | None,
    stop_token_ids: list[int] | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> Stops:
    """The run's stop ids and text stops (see the module docstring); ids keep a stable order."""
    ids: list[int] = []
    for i in [
        tokenizer.eos_token_id,
        *_generation_eos(checkpoint),
        end_of_turn(tokenizer, chat_template_kwargs),
        *(stop_token_ids or []),
    ]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    strings = []
    for s in stop_strings or []:
        if not s:
            raise ValueError("--rollout-stop: an empty stop string would stop every response at once")
        tok = tokenizer.encode(s, add_special_tokens=False)
        if len(tok) == 1 and tokenizer.decode(tok) == s:
            if tok[0] not in ids:
                ids.append(tok[0])
        else:
            strings.append(s)
    vocab = len(tokenizer)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"--rollout-stop-token-ids {bad}: outside the tokenizer's vocabulary (size {vocab})")
    return Stops(tuple(ids), tuple(strings))


def cut_at_stop_string(tokens: list[int], tokenizer: Any, strings: tuple[str, ...]) -> int | None:
    """The number of leading `tokens` that ends with the first token whose decoded prefix contains a stop
    string; None when none occurs. (Containment only grows with the prefix, so a binary search finds it.)"""
    if not strings or not tokens:
        return None

    def hit(n: int) -> bool:
        text = tokenizer.decode(tokens[:n], skip_special_tokens=True)
        return any(s in text for s in strings)

    if not hit(len(tokens)):
        return None
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hit(mid) else (mid + 1, hi)
    return lo


# -- the chat-template check ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TemplateCheck:
    """One rendered example: what was compared, and the problems found (empty = it passes)."""

    prompt_text: str
    full_text: str
    prompt_ids: list[int]
    full_ids: list[int]
    mask: list[int]  # over full_ids: 1 on the assistant's tokens (content + end-of-turn)
    problems: list[str]


def _tok(tokenizer: Any, i: int) -> str:
    return repr(tokenizer.convert_ids_to_tokens(int(i)))


def check_example(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    response: str,
    stops: Stops,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> TemplateCheck:
    """Render `messages` as the engine's prompt and `messages + [assistant: response]` as the trainer's
    conversation, and compare them token by token."""
    kw = chat_template_kwargs or {}
    problems: list[str] = []
    prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    bare = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kw)
    full_text = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": response}], tokenize=False, **kw
    )
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    full_ids = tokenizer.encode(full_text, add_special_tokens=False)
    response_ids = tokenizer.encode(response, add_special_tokens=False)
    if bare == prompt_text:
        problems.append(
            "add_generation_prompt=True renders the same text as False: the engine's prompt does not "
            "open an assistant turn, so the model continues the user's"
        )
    diff = next((i for i, (a, b) in enumerate(zip(prompt_ids, full_ids, strict=False)) if a != b), None)
    if diff is None and len(full_ids) < len(prompt_ids):
        diff = len(full_ids)
    if diff is not None:
        engine = _tok(tokenizer, prompt_ids[diff])
        trainer = _tok(tokenizer, full_ids[diff]) if diff < len(full_ids) else "(end of text)"
        problems.append(
            f"token {diff}: the engine sees {engine} (id {prompt_ids[diff]}) but the trainer scores "
            f"{trainer}{'' if diff >= len(full_ids) else f' (id {full_ids[diff]})'}: the generation "
            f"prompt is not a prefix of the rendered conversation"
        )
        return TemplateCheck(prompt_text, full_text, prompt_ids, full_ids, [0] * len(full_ids), problems)
    start, end = len(prompt_ids), len(prompt_ids) + len(response_ids)
    got = full_ids[start:end]
    if got != response_ids:
        k = next(
            (i for i, (a, b) in enumerate(zip(got, response_ids, strict=False)) if a != b),
            min(len(got), len(response_ids)),
        )
        problems.append(
            f"token {start + k}: the response tokens the engine produces ({_tok(tokenizer, response_ids[k]) if k < len(response_ids) else 'end'}) "
            f"differ from the conversation's ({_tok(tokenizer, got[k]) if k < len(got) else 'end'}): "
            "the template changes the assistant's content"
        )
    eot = full_ids[end] if end < len(full_ids) else None
    mask = [0] * len(full_ids)
    for i in range(start, min(end + (eot is not None), len(full_ids))):
        mask[i] = 1
    if eot is None:
        problems.append(
            "the rendered conversation ends right after the assistant's content: no end-of-turn token"
        )
    elif eot not in stops.ids:
        problems.append(
            f"token {end}: the assistant turn ends with {_tok(tokenizer, eot)} (id {eot}), which is not a "
            f"stop id {list(stops.ids)}: generation would run past the end of the turn; add "
            f"--rollout-stop-token-ids {eot}"
        )
    return TemplateCheck(prompt_text, full_text, prompt_ids, full_ids, mask, problems)


def check_examples(
    tokenizer: Any,
    examples: list[tuple[list[dict[str, Any]], str]],
    stops: Stops,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[TemplateCheck]:
    """`check_example` over (messages, response) pairs; a tokenizer without a template is one problem."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template (tokenizer_config.json 'chat_template'); drop "
            "--apply-chat-template or use a checkpoint that has one"
        )
    return [check_example(tokenizer, m, r, stops, chat_template_kwargs) for m, r in examples]


def engine_side_problem(
    tokenizer: Any, engine_text: str, engine_ids: list[int], check: TemplateCheck
) -> str | None:
    """Compare the prompt tokens the engine is given (`engine_ids`, rendered as `engine_text` by the run's
    prompt pipeline) with the trainer's rendering and tokenization of the same messages (`check`). Returns the
    first differing token and which side differs, or None when they agree. A differing rendered text blames
    the template; differing ids of the same text blame the tokenizer."""
    trainer_ids = check.prompt_ids
    if engine_ids == trainer_ids:
        return None
    k = next(
        (i for i, (a, b) in enumerate(zip(engine_ids, trainer_ids, strict=False)) if a != b),
        min(len(engine_ids), len(trainer_ids)),
    )

    def at(ids: list[int]) -> str:
        return f"{_tok(tokenizer, ids[k])} (id {ids[k]})" if k < len(ids) else "(end of prompt)"

    cause = (
        "same rendered text, other token ids: the tokenizer on the engine's side differs"
        if engine_text == check.prompt_text
        else "the rendered prompt text differs: the chat template (or its kwargs) on the engine's side differs"
    )
    return (
        f"token {k}: the engine is given {at(engine_ids)} but the trainer's rendering and tokenization give "
        f"{at(trainer_ids)} ({len(engine_ids)} vs {len(trainer_ids)} prompt tokens): {cause}"
    )


def format_check(tokenizer: Any, check: TemplateCheck) -> str:
    """A readable report of one example: both renders, the ids, the loss mask, the verdict."""
    masked = [
        tokenizer.convert_ids_to_tokens(int(i)) for i, m in zip(check.full_ids, check.mask, strict=True) if m
    ]
    lines = [
        f"  engine prompt : {check.prompt_text!r}",
        f"  conversation  : {check.full_text!r}",
        f"  prompt ids    : {check.prompt_ids}",
        f"  full ids      : {check.full_ids}",
        f"  loss mask on  : {masked}",
    ]
    lines += [f"  MISMATCH: {p}" for p in check.problems] or ["  ok"]
    return "\n".join(lines)
