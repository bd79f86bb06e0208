"""Lazy name -> engine class: a backend module is imported only when its name is asked for, so the CPU suite
never imports sglang. The names are config/backends.py's table (deleting a backend = its folder + its line
there)."""

from __future__ import annotations

import importlib
from typing import cast

from config.backends import ENGINES
from engines.base import Engine


def get_engine_class(name: str) -> type[Engine]:
    """Resolve `name` to its engine class, importing its module now."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout backend {name!r}; available here: {sorted(ENGINES)}")
    module, _, attr = ENGINES[name].partition(":")
    return cast(type[Engine], getattr(importlib.import_module(module), attr))
