"""slime's `--rm-type dapo` (DAPO's math reward, after Minerva): the last `Answer: X` line of the response's last
300 characters, normalised, must equal the integer label. It scores 1.0 or -1.0 (a missing or wrong answer
is penalised, not 0) and, as in slime, returns a dict {"score", "acc", "pred"}: give `--reward-key score`."""

from __future__ import annotations

import re
from typing import Any

_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva's normal form: the words and markup that do not change an answer
_REPLACED = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square ways integers dollars mph inches hours km units \\ldots sue points feet minutes digits cents "
    "degrees cm gm pounds meters meals edges students childrentickets multiples \\text{s} \\text{.}"
).split() + [
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
]
_UNWRAPPED = (
    r"(.*?)(\$)(.*?)(\$)(.*)",  # the first $...$ span; kept with its $ until the end
    r"(\\text\{)(.*?)(\})",
    r"(\\textbf\{)(.*?)(\})",
    r"(\\overline\{)(.*?)(\})",
    r"(\\boxed\{)(.*)(\})",
)


def dapo_reward(response: str, label: Any) -> dict[str, Any]:
    """{"score": 1.0 if the answer equals the label else -1.0, "acc": that as a bool, "pred": the normalised
    answer ("[INVALID]" normalised when the tail has no `Answer:`)}; ValueError for a label that is not an
    integer once normalised."""
    found = _ANSWER.findall(response[-300:])
    pred = normal_form(found[-1] if found else "[INVALID]")
    correct = pred == integer_label(label)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def integer_label(label: Any) -> str:
    """The label as DAPO compares it: normalised, then as an integer (DAPO's answers all are)."""
    text = normal_form(label)
    try:
        return str(int(float(text)))
    except (ValueError, OverflowError):
        raise ValueError(
            f"dapo compares integer answers; label {str(label)[:60]!r} reads as {text!r}"
        ) from None


def normal_form(answer: Any) -> str:
    """Minerva's normalisation: the right side of an equation, without units, words and markup."""
    text = str(answer).split("=")[-1]
    for old, new in _REPLACED:
        text = text.replace(old, new)
    for gone in _REMOVED:
        text = text.replace(gone, "")
    text = re.sub(_UNWRAPPED[0], "$\\3$", text)
    for pattern in _UNWRAPPED[1:]:
        text = re.sub(pattern, "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)  # \frac12 -> \frac{1}{2}
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)  # \sqrt2 -> \sqrt{2}
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()
