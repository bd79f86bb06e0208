"""The warm-up's settings and where its checkpoint lives in the cache (light: no torch, no model code, so a
dry run can name the checkpoint without building it)."""

from __future__ import annotations

import dataclasses
import os
import pathlib

from transformers import PreTrainedTokenizerBase

from recipes.common import CACHE_ENV_VAR, checkpoint_fingerprint, default_cache_dir  # noqa: F401  (re-exported)
from recipes.tiny_arith.model import model_config
from recipes.tiny_arith.tokenizer import build_tokenizer

# Bump whenever the warm-up procedure changes in a way the settings do not capture.
RECIPE_VERSION = 2  # 2: float64 warm-up, fixed step count, whole eval split


@dataclasses.dataclass(frozen=True)
class WarmupSettings:
    """Everything that determines the warm-up result (all part of the cache key)."""

    model_seed: int = 0
    data_seed: int = 1
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    # Chosen with RL runs from 400-600 steps (bench/learning.py's recipe): 500 gained the most;
    # a longer warm-up leaves GRPO less room to climb (bench/HISTORY.md).
    steps: int = 500
    # Progress line (loss, sampled accuracy on the val slice) every this many steps.
    log_every: int = 100
    # Held-out slice of the *train* split, used only for the progress line.
    val_size: int = 256
    val_seed: int = 2
    sample_seed: int = 3
    temperature: float = 1.0


def recipe_fingerprint(settings: WarmupSettings, tok: PreTrainedTokenizerBase) -> str:
    """Short hash naming the checkpoint directory for ``settings`` and ``tok``."""
    return checkpoint_fingerprint(RECIPE_VERSION, settings, model_config(len(tok)).to_dict(), tok)  # type: ignore[arg-type]


def checkpoint_path(
    cache_dir: str | os.PathLike[str] | None = None, settings: WarmupSettings | None = None
) -> pathlib.Path:
    """Where `ensure_checkpoint` puts (or finds) the checkpoint for `settings`, without building it."""
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / f"tiny-arith-{recipe_fingerprint(settings or WarmupSettings(), build_tokenizer())}"
