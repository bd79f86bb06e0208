"""What verifying a checkpoint's content costs at `--load`: a recipe's model saved as a `--save` checkpoint (weights,
AdamW moments, RNG; artifacts/content_hashes.py), then loaded by the trainer (torch, or Megatron on the CPU, whose
load re-reads its files to check them) with and without the check of every tensor against its saved hash, and linted (the `--load` check before a run starts, and `lint-ckpt`) with
and without re-hashing the files. Alternated, medians of --repeats; prints the checkpoint's size and each time.

    python bench/ckpt_verify.py [--recipe tiny-arith|long-arith] [--backend torch|megatron] [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifacts.lint import lint_checkpoint  # noqa: E402
from config import RunConfig  # noqa: E402
from trainers.core import TrainerCore as Trainer  # noqa: E402
from trainers.settings import trainer_settings  # noqa: E402
from trainers.torch_trainer.trainer import TorchTrainer  # noqa: E402


def _recipe_checkpoint(recipe: str) -> str:
    if recipe == "long-arith":
        from recipes.long_arith.bootstrap import ensure_checkpoint
    else:
        from recipes.tiny_arith.bootstrap import ensure_checkpoint
    return str(ensure_checkpoint())


def _trainer(cfg: RunConfig, checkpoint: str, verify: bool) -> Trainer:
    settings = dataclasses.replace(trainer_settings(cfg), verify_checkpoint=verify)
    trainer: Trainer
    if cfg.train.train_backend == "megatron":
        from trainers.megatron.trainer import MegatronTrainer

        trainer = MegatronTrainer(settings, checkpoint, 0, 1, device="cpu")
    else:
        trainer = TorchTrainer(settings, checkpoint, rank=0, world_size=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    trainer.setup("127.0.0.1", port)
    return trainer


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", choices=["tiny-arith", "long-arith"], default="long-arith")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", choices=["torch", "megatron"], default="torch")
    args = ap.parse_args()
    checkpoint = _recipe_checkpoint(args.recipe)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.model_validate(
            {"hf_checkpoint": checkpoint, "run_dir": tmp, "train": {"train_backend": args.backend}}
        )
        trainer = _trainer(cfg, checkpoint, True)
        assert trainer.optimizer is not None
        for p in trainer.params:  # one optimizer step gives the checkpoint its AdamW moments, as a run's has
            p.grad = torch.zeros_like(p)
        trainer.optimizer.step()
        save = Path(tmp) / "save"
        trainer.save(str(save), 0)
        ckpt = save / "iter_0000000"
        size = sum(f.stat().st_size for f in ckpt.iterdir() if f.suffix in (".safetensors", ".distcp"))
        loaders = {v: _trainer(cfg, checkpoint, v) for v in (True, False)}
        times: dict[str, list[float]] = {k: [] for k in ("load", "load-unverified", "lint", "lint-headers")}
        for _ in range(args.repeats):  # alternated, so that the machine's drift falls on both sides
            times["load"].append(_seconds(lambda: loaders[True].load(str(save))))
            times["load-unverified"].append(_seconds(lambda: loaders[False].load(str(save))))
            times["lint"].append(_seconds(lambda: lint_checkpoint(save)))
            times["lint-headers"].append(_seconds(lambda: lint_checkpoint(save, verify_content=False)))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{args.recipe}, {args.backend} backend: checkpoint {size / 2**20:.1f} MiB (weights, AdamW state, RNG)"
    )
    print(
        f"trainer load: {med['load'] * 1e3:.1f} ms verified, {med['load-unverified'] * 1e3:.1f} ms with "
        f"--no-verify-checkpoint (+{(med['load'] - med['load-unverified']) * 1e3:.1f} ms, "
        f"{med['load'] / med['load-unverified']:.2f}x)"
    )
    print(
        f"lint (the --load check before a run, and lint-ckpt): {med['lint'] * 1e3:.1f} ms verified, "
        f"{med['lint-headers'] * 1e3:.1f} ms headers only (+{(med['lint'] - med['lint-headers']) * 1e3:.1f} ms)"
    )
    extra = med["load"] - med["load-unverified"] + med["lint"] - med["lint-headers"]
    print(f"added to a --load in all: {extra * 1e3:.1f} ms, {size / 2**20 / extra:.0f} MiB/s of checkpoint")


if __name__ == "__main__":
    main()
