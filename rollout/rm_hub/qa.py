"""slime's question-answering rules: `f1` (SQuAD token F1) and `gpqa` (the chosen multiple-choice letter)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

_VERDICTS = ("yes", "no", "noanswer")


def squad_normal_form(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_reward(response: str, label: Any) -> float:
    """slime's `--rm-type f1`: the F1 of the normalised tokens of response and label; 0 when a yes/no/noanswer
    verdict on either side is not matched exactly. The label must be text (a number fails the sample, as in
    slime)."""
    pred, gold = squad_normal_form(response), squad_normal_form(label)
    if (pred in _VERDICTS or gold in _VERDICTS) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


# -- gpqa --------------------------------------------------------------------------------------------------
_LETTER_PATTERNS = (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])",
    r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)",
    r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])",
)


def gpqa_reward(response: str, label: Any, metadata: dict[str, Any]) -> float:
    """slime's `--rm-type gpqa`: 1 when the letter the response chooses (after any `</think>`) is the correct
    one. The correct letter is metadata `correct_letter`, else a one-letter label, else the label as an
    index, else the choice (metadata `choices`) whose text is the label. With no letter to compare, 1 when the
    response contains the correct answer's text."""
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        choices = list(choices.values())
    elif choices is not None:
        choices = list(choices)
    given = metadata.get("valid_letters")
    if given:
        letters = [str(x).upper() for x in given]
    else:
        letters = list(string.ascii_uppercase[: len(choices) if choices else 10])
    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in letters and not correct:
            correct = label_text.upper()
    elif isinstance(label, int | float):
        if 0 <= int(label) < len(letters):
            correct = letters[int(label)]
    answer = metadata.get("correct_answer")
    if not correct and choices and label_text:
        for i, choice in enumerate(choices):
            if _plain(str(choice)) == _plain(label_text):
                correct = letters[i]
                answer = answer if "correct_answer" in metadata else choice
                break
    chosen = _chosen_letter(_after_thinking(response), letters)
    if chosen and correct:
        return 1.0 if chosen == correct else 0.0
    wanted = []
    if correct and choices and correct in letters and letters.index(correct) < len(choices):
        wanted.append(str(choices[letters.index(correct)]))
    wanted += [str(v) for v in (answer, metadata.get("answer_text")) if v]
    if label_text:
        wanted.append(label_text)
    said = _plain(_after_thinking(response))
    if any(t and t in said for t in {_plain(w) for w in wanted}):
        return 1.0
    if chosen and not correct and label_text:
        return 1.0 if chosen == label_text.upper() else 0.0
    return 0.0


def _after_thinking(text: str) -> str:
    return text.rsplit("</think>", 1)[-1] if "</think>" in text else text


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _chosen_letter(text: str, letters: list[str]) -> str | None:
    """The letter named by "answer is X"-style phrases, else the last standalone valid capital letter."""
    if not text:
        return None
    valid = set(letters)
    for pattern in _LETTER_PATTERNS:
        m = re.search(pattern, text, flags=re.IGNORECASE)
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None
