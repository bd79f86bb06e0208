"""Lazy name -> class registry of training backends (megatron is imported only when named)."""

from __future__ import annotations

import importlib
from typing import Any

TRAINERS: dict[str, str] = {
    "torch": "trainers.torch_trainer.trainer:TorchTrainer",
    "megatron": "trainers.megatron.trainer:MegatronTrainer",
}


def get_trainer_class(name: str) -> Any:
    """Resolve `name` to its trainer class, importing its module now."""
    if name not in TRAINERS:
        raise ValueError(f"unknown train backend {name!r}; available here: {sorted(TRAINERS)}")
    module, _, attr = TRAINERS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
