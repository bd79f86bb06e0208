"""User extension points given as dotted paths (`--custom-rm-path pkg.mod.fn`), resolved the way slime
resolves them: `importlib.import_module("pkg.mod")` then `getattr(module, "fn")`, with the working
directory importable as well as PYTHONPATH."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


class ExtensionError(ValueError):
    """A dotted path that does not name an importable callable."""


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """The callable named by `path` ("module.sub.fn"); `flag` names the option in error messages."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ExtensionError(f"{flag} {path!r}: expected a dotted path module.function")
    cwd = os.getcwd()
    if cwd not in sys.path:  # slime users run from their project directory; PYTHONPATH is already on sys.path
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, but also a SyntaxError or an error raised at import time
        raise ExtensionError(
            f"{flag} {path!r}: cannot import {module_name!r}: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ExtensionError(
            f"{flag} {path!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
            f"has no attribute {attr!r}"
        )
    if not callable(fn):
        raise ExtensionError(f"{flag} {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn
