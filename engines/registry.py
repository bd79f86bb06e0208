"""Lazy name -> class registry: a backend module is imported only when its name is asked for,
so the CPU suite never imports sglang. Deleting a backend = its folder + its line here."""

from __future__ import annotations

import importlib
from typing import Any

ENGINES: dict[str, str] = {
    "torch": "engines.torch_engine.engine:TorchEngine",
}


def get_engine_class(name: str) -> Any:
    """Resolve `name` to its engine class, importing its module now."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout backend {name!r}; available here: {sorted(ENGINES)}")
    module, _, attr = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), attr)
