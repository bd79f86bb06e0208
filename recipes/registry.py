"""Recipes: where the prompts, the reward and the base model of a run come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Recipe:
    """A data + reward + base-model bundle. Problems are {"question": str, "label": str} dicts."""

    name: str
    ensure_checkpoint: Callable[[], object]          # -> path of an HF dir (model + tokenizer)
    train_problems: Callable[[], list[dict]]         # the whole training pool, fixed order
    eval_problems: Callable[[], list[dict]]          # the held-out eval set
    format_prompt: Callable[[object, str], str]      # (tokenizer, question) -> prompt text
    reward: Callable[[str, str], float]              # (response text, label) -> reward


@cache
def _tiny_arith_pool() -> tuple[dict, ...]:
    from recipes.tiny_arith import data

    return tuple(data.make_problems(4096, seed=0, split="train"))  # built once per process: every rollout reads it


def _tiny_arith() -> Recipe:
    from recipes.tiny_arith import bootstrap, data, reward

    return Recipe(
        name="tiny-arith",
        ensure_checkpoint=bootstrap.ensure_checkpoint,
        train_problems=lambda: list(_tiny_arith_pool()),
        eval_problems=data.eval_problems,
        format_prompt=data.format_prompt,  # type: ignore[arg-type]
        reward=reward.reward,
    )


RECIPES: dict[str, Callable[[], Recipe]] = {"tiny-arith": _tiny_arith}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name` (imported lazily)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; available: {sorted(RECIPES)}")
    return RECIPES[name]()
