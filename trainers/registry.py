"""Lazy name -> trainer class: megatron is imported only when named. The names are config/backends.py's
table (deleting a backend = its folder + its line there)."""

from __future__ import annotations

import importlib
from typing import cast

from config.backends import TRAINERS
from trainers.base import Trainer


def get_trainer_class(name: str) -> type[Trainer]:
    """Resolve `name` to its trainer class, importing its module now."""
    if name not in TRAINERS:
        raise ValueError(f"unknown train backend {name!r}; available here: {sorted(TRAINERS)}")
    module, _, attr = TRAINERS[name].partition(":")
    return cast(type[Trainer], getattr(importlib.import_module(module), attr))
