"""Recipes: presets that fill in what a run's flags leave unset (base model, prompt data and its keys,
eval data, reward). A recipe's data goes through the same generic path as a user's `--prompt-data`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.common import DONE_MARKER


@dataclass(frozen=True)
class Recipe:
    """A base model + data + reward bundle."""

    name: str
    ensure_checkpoint: Callable[[], Path]  # the HF dir (model + tokenizer), built on first use
    checkpoint_path: Callable[[], Path]  # where it is or will be, without building it
    tokenizer: Callable[[], Any]  # the checkpoint's tokenizer, without building the model
    ensure_data: Callable[[], tuple[Path, Path]]  # (train, eval) prompt files, written on first use
    data: dict[str, Any] = field(default_factory=dict)  # DataConfig fields for reading those files
    rm_type: str = ""  # the registered reward (rollout.rewards.BUILTIN_REWARDS)
    rollout: dict[str, Any] = field(
        default_factory=dict
    )  # RolloutConfig fields the recipe needs (e.g. lengths)

    def built_checkpoint(self) -> Path:
        """The HF dir, built first where it is not complete: the build's code (torch, transformers' model
        classes) is imported only then, not into every process that runs the recipe."""
        path = self.checkpoint_path()
        return path if (path / DONE_MARKER).exists() else self.ensure_checkpoint()


_CHAT_PROMPTS = {
    "input_key": "prompt",
    "label_key": "label",
    "apply_chat_template": True,
    "rollout_shuffle": True,
}


def _tiny_arith() -> Recipe:
    from recipes.tiny_arith import data, settings, tokenizer

    def ensure_checkpoint() -> Path:
        from recipes.tiny_arith import bootstrap  # torch and the model code: only when a model is built

        return bootstrap.ensure_checkpoint()

    return Recipe(
        name="tiny-arith",
        ensure_checkpoint=ensure_checkpoint,
        checkpoint_path=settings.checkpoint_path,
        tokenizer=tokenizer.build_tokenizer,
        ensure_data=data.ensure_prompt_files,
        data=_CHAT_PROMPTS,
        rm_type="tiny-arith",
    )


def _long_arith() -> Recipe:
    from recipes.long_arith import data, settings, tokenizer

    def ensure_checkpoint() -> Path:
        from recipes.long_arith import bootstrap

        return bootstrap.ensure_checkpoint()

    return Recipe(
        name="long-arith",
        ensure_checkpoint=ensure_checkpoint,
        checkpoint_path=settings.checkpoint_path,
        tokenizer=tokenizer.build_tokenizer,
        ensure_data=data.ensure_prompt_files,
        data=_CHAT_PROMPTS,
        rm_type="long-arith",
        rollout={"rollout_max_response_len": data.MAX_RESPONSE_TOKENS},
    )


def _long_arith_scale(name: str) -> Recipe:
    """long-arith's prompts, reward and response length with recipes.long_arith_scale's untrained model `name`."""
    from recipes.long_arith import data
    from recipes.long_arith_scale import settings, tokenizer

    settings.shape_of(name)  # an unknown name is refused before anything is built

    def ensure_checkpoint() -> Path:
        from recipes.long_arith_scale import bootstrap

        return bootstrap.ensure_checkpoint(name)

    return Recipe(
        name=name,
        ensure_checkpoint=ensure_checkpoint,
        checkpoint_path=lambda: settings.checkpoint_path(name),
        tokenizer=tokenizer.build_tokenizer,
        ensure_data=data.ensure_prompt_files,
        data=_CHAT_PROMPTS,
        rm_type="long-arith",
        rollout={"rollout_max_response_len": data.MAX_RESPONSE_TOKENS},
    )


RECIPES: dict[str, Callable[[], Recipe]] = {
    "tiny-arith": _tiny_arith,
    "long-arith": _long_arith,
    "long-arith-50m": lambda: _long_arith_scale("long-arith-50m"),
    "long-arith-0.5b": lambda: _long_arith_scale("long-arith-0.5b"),
}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name` (imported lazily)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; available: {sorted(RECIPES)}")
    return RECIPES[name]()
