"""What every bad-input case is built from: `Case`, and the command lines and small files the cases share."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    """One bad input: `argv(tmp)` builds the command line (and any file it needs) in `tmp`; the refusal must
    contain `needle`."""

    kind: str  # the class of bad input (one test per class at least)
    what: str  # what is wrong, in words (the README's table)
    argv: Callable[[Path], list[str]]
    needle: str


def _fixed(*argv: str) -> Callable[[Path], list[str]]:
    return lambda tmp: list(argv)


def _model_dir(tmp: Path) -> Path:
    """An HF model dir as far as the checks before a run read it: a 3-layer Qwen2 config.json and a tokenizer file."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 3}))
    (model / "tokenizer.json").write_text("{}")
    return model


def run(*flags: str, needle: str, kind: str, what: str) -> Case:
    """A `rollflow run` case, in a run dir of the test's own (an explicit --run-dir in `flags` wins)."""
    return Case(kind, what, lambda tmp: ["run", "--run-dir", str(tmp / "run"), *flags], needle)


def _yaml(tmp: Path, text: str, name: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _jsonl(tmp: Path, text: str, name: str) -> str:
    path = tmp / f"{name}.jsonl"
    path.write_bytes(text.encode("latin-1") if name == "binary" else text.encode())
    return str(path)


def _model_dir_without_config(tmp: Path) -> str:
    d = tmp / "not-a-model"
    d.mkdir(exist_ok=True)
    return str(d)
