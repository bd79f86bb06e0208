"""slime's `math` and `deepscaler` rules: the response's last `\\boxed{...}` against the label, equal when the
MATH dataset's string normalisation makes them identical, or when the PRM800K normalisation makes them
identical or sympy simplifies their difference to 0.

The two normalisations are string rules (what counts as the same written answer); parsing is left to
libraries: pylatexenc turns LaTeX into text, sympy parses and simplifies. Every quirk of slime's grader is
kept, since a reward is only comparable to slime's if it gives the same number on the same text: a label
that is falsy (0, "") scores 0 under `math`, unreduced fractions (2/4 vs 1/2) and an integer against a
non-integer expression are never sent to sympy, and `\\fbox{}` is not an answer."""

from __future__ import annotations

import logging
import re
from functools import cache
from typing import Any

BOX = "\\boxed"


def boxed_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text` (braces balanced from `\\boxed` on), or None when there
    is none, it never closes, or the brace after `\\boxed` is not the next character."""
    start = text.rfind(BOX)
    if start < 0:
        return None
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                whole = text[start : end + 1]
                return whole[len(BOX) + 1 : -1] if whole.startswith(BOX + "{") else None
    return None


def math_reward(response: str, label: Any) -> float:
    """slime's `--rm-type math`: 1 when the response's boxed answer equals the label (itself unboxed when it
    holds a `\\boxed{}`), else 0; no boxed answer, or a falsy label, scores 0."""
    if not label:
        return 0.0
    text = str(label)
    truth = boxed_answer(text) if BOX in text else text
    answer = boxed_answer(response)
    if answer is None:
        return 0.0
    return 1.0 if same_answer(answer, truth) else 0.0


def deepscaler_reward(response: str, label: Any) -> float:
    """slime's `--rm-type deepscaler`: only the text after the last `</think>` (else after the first
    `###Response`) counts; its boxed answer must equal the label as under `math`. A response with neither
    marker, or no boxed answer there, or an empty label, scores 0."""
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0.0
    answer = boxed_answer(solution)
    if answer is None or label == "":
        return 0.0
    if not isinstance(label, str | int | float):
        raise TypeError(f"deepscaler compares with a string or number label, got {type(label).__name__}")
    text = str(label)
    truth = boxed_answer(text) if BOX in text else text
    if truth is None:
        return 0.0
    return 1.0 if same_answer(answer, truth) else 0.0


def same_answer(answer: str, truth: str | None) -> bool:
    """The grader: equal after the MATH normalisation, or equal under the PRM800K normalisation and sympy."""
    if truth is not None and _mathd_form(truth) == _mathd_form(answer):
        return True
    return _sympy_same(answer, truth)


# -- the MATH dataset normalisation (Hendrycks et al.) ------------------------------------------------------
_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")


def _mathd_form(answer: str) -> str:
    """`answer` without an enclosing `\\text{}` and in the MATH normal form; as written (stripped) when a rule
    does not apply to its shape."""
    answer = answer.strip()
    m = _TEXT_WRAPPED.search(answer)
    if m is not None:
        answer = m.group("text").strip()
    try:
        return _math_normal_form(answer)
    except (IndexError, ValueError):
        return answer


def _math_normal_form(s: str) -> str:
    """The MATH normalisation; IndexError/ValueError where the text has a shape the rules cannot handle."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac")):
        s = s.replace(old, new)
    for gone in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        s = s.replace(gone, "")
    if "\\text{ " in s:  # a unit on the right, as the dataset writes it
        before, *after = s.split("\\text{ ")
        if len(after) != 1:
            raise ValueError("more than one unit")
        s = before
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" -> "3"
        s = sides[1]
    s = _braced_sqrt(s).replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def _braced_sqrt(s: str) -> str:
    """`\\sqrt3` -> `\\sqrt{3}` (one character)."""
    first, *rest = s.split("\\sqrt")
    return first + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in rest)


def _braced_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{7}` -> `\\frac{1}{7}`; the text unchanged when a `\\frac` is
    followed by fewer than two characters."""
    first, *rest = s.split("\\frac")
    out = [first]
    for p in rest:
        if p[0] == "{":
            out.append("\\frac" + p)
        elif len(p) < 2:
            return s
        elif p[1] == "{":
            out.append("\\frac{" + p[0] + "}" + p[1:])
        else:
            out.append("\\frac{" + p[0] + "}{" + p[1] + "}" + p[2:])
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    """`3/4` -> `\\frac{3}{4}` when both sides are integers written plainly."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


# -- the PRM800K normalisation and the sympy check ---------------------------------------------------------
_UNITS = "degree cm centimeter meter mile second minute hour day week month year foot feet inch yard".split()
_BRACKETS = "()[]"


def _sympy_same(answer: str, truth: str | None) -> bool:
    """Equal as PRM800K-normalised text, or element by element (tuples and intervals) with sympy, where
    fractions must match as written and an integer only matches an integer."""
    t, a = _prm_form(truth), _prm_form(answer)
    if t is None:
        return False
    if t == a:
        return True
    if not a:
        return False
    t_items, a_items = _tuple_items(t), _tuple_items(a)
    if len(t_items) > 1 and (t[0] != a[0] or t[-1] != a[-1]):  # ( vs [ of an interval
        return False
    if len(t_items) != len(a_items):
        return False
    for ti, ai in zip(t_items, a_items, strict=True):
        if _is_fraction(ti) and _is_fraction(ai):
            ok = ti == ai
        elif _looks_integer(ti) != _looks_integer(ai):
            ok = False
        else:
            ok = _zero_difference(ti, ai)
        if not ok:
            return False
    return True


def _prm_form(expr: str | None) -> str | None:
    """The PRM800K normal form: units, $ and % gone, LaTeX as plain text, lower case, integers canonical."""
    if expr is None:
        return None
    m = _TEXT_WRAPPED.search(expr)
    if m is not None:
        expr = m.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , ")):
        expr = expr.replace(old, new)
    for word, power in (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(word, power)
    for unit in _UNITS:
        expr = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    number = _as_float(expr)
    if number is not None and _near_integer(number):
        expr = str(round(number))
    if "\\" in expr:
        try:
            expr = _latex_as_text(expr)
        except Exception:  # pylatexenc gives up on some malformed LaTeX: the text is compared as written
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", "\\1+\\2", expr)  # a mixed number 7 3/4 is 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _looks_integer(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _latex_as_text(expr: str) -> str:
    from pylatexenc import latex2text

    # it warns on every malformed macro (a bare \\frac), which the grader then compares as written
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(symbol, name)
    return text.strip()


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _near_integer(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _looks_integer(text: str) -> bool:
    number = _as_float(_without_thousands_commas(text))
    return number is not None and _near_integer(number)


def _is_fraction(text: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", text) is not None


def _without_thousands_commas(text: str) -> str:
    """1,234,567 -> 1234567, leaving the commas of a tuple (1,2) alone."""
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        shorter = pattern.sub("\\1\\3\\4", text)
        if shorter == text:
            return text
        text = shorter


def _tuple_items(expr: str) -> list[str]:
    """The elements of a tuple or interval written `(a,b)` / `[a,b)`, else `[expr]`; [] for empty text."""
    expr = _without_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _BRACKETS
        and expr[-1] in _BRACKETS
        and not any(c in inner for c in _BRACKETS)
    ):
        return [item.strip() for item in inner.split(",")]
    return [expr]


def _zero_difference(truth: str, answer: str) -> bool:
    """sympy simplifies truth - answer to 0; never tried on text that could make it hang (exponent towers,
    more than two unknowns), and False on anything it cannot parse."""
    expr = f"({truth})-({answer})"
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    if re.search(r"\^[0-9]+\^", expr) or re.search(r"\^[0-9][0-9]+", expr):
        return False
    try:
        import sympy

        return bool(sympy.simplify(_parse(expr.replace("^", "**"))) == 0)
    except Exception:  # sympy raises many types on text it cannot read: not equal
        return False


@cache
def _sympy_names() -> dict[str, Any]:
    """sympy's public names and no builtins, so parsing an answer cannot run arbitrary code."""
    import sympy

    return {"__builtins__": {}, **{k: v for k, v in vars(sympy).items() if not k.startswith("_")}}


def _parse(text: str) -> Any:
    from sympy.parsing import sympy_parser as sp

    rules = sp.standard_transformations + (sp.implicit_multiplication_application,)
    return sp.parse_expr(text, local_dict={}, global_dict=dict(_sympy_names()), transformations=rules)
