"""Synthetic two-digit addition problems for tiny-arith.

Contract:
    * A problem is ``{"question": "23+45", "label": "68"}`` (plain strings, no chat markup);
      operands are in ``OPERAND_RANGE`` (10..99), so answers are 2-3 characters.
    * Every (a, b) pair belongs to exactly one split, decided by a hash of the pair
      (~``EVAL_FRACTION`` of pairs go to "eval"), so train and eval never overlap
      regardless of seed or sample size.
    * ``make_problems`` is deterministic for a given (n, seed, split).
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path

from recipes.common import format_prompt  # noqa: F401  (re-exported: "<|user|>23+45=<|assistant|>")

OPERAND_RANGE = range(10, 100)
EVAL_FRACTION = 0.10
SPLITS = ("train", "eval")


def _split_of(a: int, b: int) -> str:
    # sha256 rather than hash(): Python's str hashing is salted per process.
    digest = hashlib.sha256(f"tiny-arith:{a}+{b}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    return "eval" if bucket < EVAL_FRACTION else "train"


@functools.cache
def _pairs(split: str) -> tuple[tuple[int, int], ...]:
    return tuple((a, b) for a in OPERAND_RANGE for b in OPERAND_RANGE if _split_of(a, b) == split)


def _problem(a: int, b: int) -> dict[str, str]:
    return {"question": f"{a}+{b}", "label": str(a + b)}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def all_problems(split: str) -> list[dict[str, str]]:
    """Every problem of ``split`` in a fixed (a, b)-sorted order."""
    _check_split(split)
    return [_problem(a, b) for a, b in _pairs(split)]


def make_problems(n: int, seed: int, split: str) -> list[dict[str, str]]:
    """Draw ``n`` problems from ``split``, deterministically for ``seed``.

    Problems are distinct when ``n`` is at most the split's size (8100 pairs in all,
    ~90% train); larger requests are drawn with replacement.
    """
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pairs = _pairs(split)
    rng = random.Random(f"{split}:{seed}")
    chosen = rng.sample(pairs, n) if n <= len(pairs) else rng.choices(pairs, k=n)
    return [_problem(a, b) for a, b in chosen]


def eval_problems() -> list[dict[str, str]]:
    """The held-out eval set: every problem of the "eval" split (793 of them), in a fixed order.

    All of them, so that an eval with 4 samples per problem has a standard error of about one
    point (64 problems gave about three, as large as the effect RL should show)."""
    return all_problems("eval")


# Bump when the rows written by `ensure_prompt_files` change.
DATA_VERSION = 1
TRAIN_POOL_SIZE = 4096


def ensure_prompt_files(cache_dir: str | None = None) -> tuple[Path, Path]:
    """tiny-arith's training and eval prompts as Parquet files in the model cache (written once, atomically):
    train = 4096 problems of the train split (the pool the default run visits, in a fixed order), eval =
    the whole eval split. They are read like any `--prompt-data` file (`--input-key prompt --label-key label
    --apply-chat-template`)."""
    from recipes.common import default_cache_dir, write_prompt_files

    root = (Path(cache_dir) if cache_dir else default_cache_dir()) / f"tiny-arith-data-v{DATA_VERSION}"
    files = write_prompt_files(
        root, {"train": lambda: make_problems(TRAIN_POOL_SIZE, seed=0, split="train"), "eval": eval_problems}
    )
    return files["train"], files["eval"]
