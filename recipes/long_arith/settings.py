"""The long-arith warm-up's settings and where its checkpoint lives in the cache (light: no torch, no model code,
so a dry run can name the checkpoint without building it)."""

from __future__ import annotations

import dataclasses
import os
import pathlib

from transformers import PreTrainedTokenizerBase

from recipes.common import checkpoint_fingerprint, default_cache_dir
from recipes.long_arith.model import model_config
from recipes.long_arith.tokenizer import build_tokenizer

# Bump whenever the warm-up procedure changes in a way the settings do not capture.
RECIPE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class WarmupSettings:
    """Everything that determines the warm-up result (all part of the cache key), the model's size included."""

    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    model_seed: int = 0
    data_seed: int = 1
    # Each step's batch has one digit count (drawn uniformly), so rows have about the same length: no padding.
    batch_size: int = 16
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    steps: int = 200
    # Progress line (loss, reward of sampled answers to a few held-out problems) every this many steps.
    log_every: int = 50
    val_size: int = 16
    sample_seed: int = 3
    temperature: float = 1.0


def recipe_fingerprint(settings: WarmupSettings, tok: PreTrainedTokenizerBase) -> str:
    """Short hash naming the checkpoint directory for ``settings`` and ``tok``."""
    return checkpoint_fingerprint(RECIPE_VERSION, settings, model_config(len(tok), settings).to_dict(), tok)  # type: ignore[arg-type]


def checkpoint_path(
    cache_dir: str | os.PathLike[str] | None = None, settings: WarmupSettings | None = None
) -> pathlib.Path:
    """Where `ensure_checkpoint` puts (or finds) the checkpoint for `settings`, without building it."""
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / f"long-arith-{recipe_fingerprint(settings or WarmupSettings(), build_tokenizer())}"
