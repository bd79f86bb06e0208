"""Synthetic step-by-step additions for long-arith.

Contract:
    * A problem is ``{"question": "4821937+6620154", "label": solution(a, b)}``; both operands have the same number
      of digits, drawn uniformly from ``DIGITS`` (7..25).
    * ``solution`` adds digit by digit from the right, each step ``a+b+carry=sum;``, then the sum:
      ``solution(58, 64) == "8+4+0=12;5+6+1=12;=122"``. An N-digit problem takes about 9.5 N + 2 tokens (with
      ``<eos>``): 69 to 243 over ``DIGITS``.
    * Every (a, b) pair belongs to one split, decided by a hash of the pair (~``EVAL_FRACTION`` of pairs go to
      "eval"); ``make_problems`` is deterministic for a given (n, seed, split, digits).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

DIGITS = range(7, 26)
EVAL_FRACTION = 0.10
SPLITS = ("train", "eval")
# The longest solution is 25 * 9 + 27 = 252 characters, 253 tokens with <eos>.
MAX_RESPONSE_TOKENS = 256


def solution(a: int, b: int) -> str:
    """The step-by-step answer for ``a + b`` (operands of the same length)."""
    da, db = str(a), str(b)
    if len(da) != len(db):
        raise ValueError(f"operands of different lengths: {a}, {b}")
    steps, carry = [], 0
    for x, y in zip(reversed(da), reversed(db), strict=True):
        total = int(x) + int(y) + carry
        steps.append(f"{x}+{y}+{carry}={total};")
        carry = total // 10
    return "".join(steps) + f"={a + b}"


def _split_of(a: int, b: int) -> str:
    digest = hashlib.sha256(f"long-arith:{a}+{b}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < EVAL_FRACTION else "train"


def make_problems(n: int, seed: int, split: str, digits: int | None = None) -> list[dict[str, str]]:
    """``n`` problems of ``split``, each with ``digits`` digits per operand (uniform over ``DIGITS`` when None)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"long-arith:{split}:{seed}:{digits}")
    problems: list[dict[str, str]] = []
    while len(problems) < n:
        k = digits if digits is not None else rng.choice(DIGITS)
        a, b = rng.randrange(10 ** (k - 1), 10**k), rng.randrange(10 ** (k - 1), 10**k)
        if _split_of(a, b) == split:
            problems.append({"question": f"{a}+{b}", "label": solution(a, b)})
    return problems


EVAL_SIZE = 128


def eval_problems() -> list[dict[str, str]]:
    """The held-out eval set: 128 problems of the "eval" split, in a fixed order (each eval sample costs up to
    256 generated tokens, so the set is smaller than tiny-arith's)."""
    return make_problems(EVAL_SIZE, seed=0, split="eval")


# Bump when the rows written by `ensure_prompt_files` change.
DATA_VERSION = 1
TRAIN_POOL_SIZE = 4096


def ensure_prompt_files(cache_dir: str | None = None) -> tuple[Path, Path]:
    """long-arith's training (4096 problems of the train split) and eval prompts as Parquet files in the model
    cache, written once, atomically, and read like any `--prompt-data` file (`--input-key prompt --label-key
    label --apply-chat-template`)."""
    from recipes.common import default_cache_dir, write_prompt_files

    root = (Path(cache_dir) if cache_dir else default_cache_dir()) / f"long-arith-data-v{DATA_VERSION}"
    files = write_prompt_files(
        root, {"train": lambda: make_problems(TRAIN_POOL_SIZE, seed=0, split="train"), "eval": eval_problems}
    )
    return files["train"], files["eval"]
