"""Cached checkpoints of the long-arith scale recipes: a Qwen2 of the recipe's shape (recipes.long_arith_scale.model)
initialised from its seed, with no training, saved as an HF checkpoint (float32 ``model.safetensors``,
``config.json``, ``generation_config.json``, the tokenizer's files, ``bootstrap_info.json``, ``DONE``).

Contract of ``ensure_checkpoint(name, cache_dir=None, shape=None, *, num_threads=1)``: as the other recipes'
(``recipes.warmup.build_once``): ``<cache>/<name>-<fingerprint>/`` built at most once per fingerprint under
``<cache>/<name>.lock`` in a temp dir published by ``os.rename``; the fingerprint covers ``RECIPE_VERSION``, the
shape (its seed included), the model config and the tokenizer.

Run ``python -m recipes.long_arith_scale.bootstrap NAME [--cache-dir D]`` to build and print the path.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import time
from collections.abc import Sequence

from recipes.common import build_model, default_cache_dir
from recipes.long_arith_scale.model import SHAPES, ModelShape, model_config
from recipes.long_arith_scale.settings import RECIPE_VERSION, checkpoint_path, recipe_fingerprint, shape_of
from recipes.long_arith_scale.tokenizer import build_tokenizer
from recipes.warmup import build_once, save_checkpoint


def _build(target: pathlib.Path, name: str, shape: ModelShape, fingerprint: str) -> None:
    """Initialise the model and write a complete checkpoint (with ``DONE``) into ``target``."""
    started = time.perf_counter()
    tok = build_tokenizer()
    config = model_config(shape, len(tok))
    if config.vocab_size != len(tok):
        raise AssertionError(
            f"{name}: the model's vocabulary ({config.vocab_size}) is not the tokenizer's ({len(tok)})"
        )
    model = build_model(config, shape.model_seed)
    info = {
        "recipe": name,
        "recipe_version": RECIPE_VERSION,
        "fingerprint": fingerprint,
        "shape": dataclasses.asdict(shape),
        "trained": False,
        "init_seconds": round(time.perf_counter() - started, 2),
    }
    save_checkpoint(target, model, tok, info, fingerprint)


def ensure_checkpoint(
    name: str,
    cache_dir: str | os.PathLike[str] | None = None,
    shape: ModelShape | None = None,
    *,
    num_threads: int = 1,
    verbose: bool = True,
) -> pathlib.Path:
    """Return recipe ``name``'s checkpoint directory, building it first if needed (see the module doc).
    ``shape`` overrides the recipe's architecture (tests build a small one through the same path)."""
    shape = shape or shape_of(name)
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    fingerprint = recipe_fingerprint(shape)

    def log(message: str) -> None:
        if verbose:
            # build_once calls every build a warm-up; this one trains nothing
            print(message.replace(" warm-up]", "]"), flush=True)

    return build_once(
        checkpoint_path(name, cache, shape),
        cache / f"{name}.lock",
        lambda tmp: _build(tmp, name, shape, fingerprint),
        num_threads=num_threads,
        log=log,
        tag=name,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Build (or find) a scale recipe's checkpoint and print its path."""
    parser = argparse.ArgumentParser(description="Build (or find) a long-arith scale recipe's checkpoint.")
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument("--cache-dir", default=None, help="default: $ROLLFLOW_CACHE_DIR or ~/.cache/rollflow")
    parser.add_argument("--num-threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(ensure_checkpoint(args.name, args.cache_dir, num_threads=args.num_threads))


if __name__ == "__main__":
    main()
