"""Where the scale recipes' checkpoints live in the cache (light: no torch, no model code, so a dry run can name a
checkpoint without building it)."""

from __future__ import annotations

import functools
import os
import pathlib

from recipes.common import checkpoint_fingerprint, default_cache_dir
from recipes.long_arith_scale.model import SHAPES, ModelShape, model_config
from recipes.long_arith_scale.tokenizer import build_tokenizer

# Bump whenever the build changes in a way the shape does not capture.
RECIPE_VERSION = 1


def shape_of(name: str) -> ModelShape:
    """The shape of recipe ``name``; ValueError naming the known ones."""
    if name not in SHAPES:
        raise ValueError(f"unknown long-arith scale recipe {name!r}; known: {sorted(SHAPES)}")
    return SHAPES[name]


@functools.cache
def recipe_fingerprint(shape: ModelShape) -> str:
    """Short hash naming the checkpoint directory of ``shape`` (the tokenizer's hash covers 151,936 entries: about
    a second, so it is computed once per process and shape)."""
    tok = build_tokenizer()
    return checkpoint_fingerprint(RECIPE_VERSION, shape, model_config(shape, len(tok)).to_dict(), tok)


def checkpoint_path(
    name: str, cache_dir: str | os.PathLike[str] | None = None, shape: ModelShape | None = None
) -> pathlib.Path:
    """Where `ensure_checkpoint` puts (or finds) recipe ``name``'s checkpoint (``shape`` overrides the recipe's
    architecture: tests), without building it."""
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / f"{name}-{recipe_fingerprint(shape or shape_of(name))}"
