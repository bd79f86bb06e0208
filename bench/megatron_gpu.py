"""The Megatron backend on a GPU against the torch backend: differences and timings, side by side.

Builds a small random Qwen2 (GQA, q/k/v bias, tied embeddings) and a synthetic rollout, then runs the
same log-prob pass and train step (two optimizer steps, two micro-batches each, KL loss and entropy
bonus on) with the torch backend (on the CPU: that backend has no GPU path) and with the Megatron
backend on `--device` (cuda by default; cpu runs the script on a machine without a GPU). Prints the
largest differences of log-probs, entropy, reference log-probs and every step metric (the issue's bound
is 1e-5 in float32), and the seconds each stage took.

    python bench/megatron_gpu.py [--hidden 256] [--layers 4] [--samples 32] [--response 64] [--device cuda]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.megatron_helpers import (  # noqa: E402
    build_hf_model,
    free_port,
    log_prob_rows,
    max_row_diff,
    run_config,
    synthetic_rollout,
)
from trainers.megatron.trainer import MegatronTrainer  # noqa: E402
from trainers.settings import trainer_settings  # noqa: E402
from trainers.torch_trainer.trainer import TorchTrainer  # noqa: E402

T = TypeVar("T")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(device: str, fn: Callable[[], T]) -> tuple[T, float]:
    """fn() and its wall seconds, the device synchronised before and after."""
    _sync(device)
    began = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=32, help="rollout size (groups of 4)")
    parser.add_argument("--response", type=int, default=64, help="longest response (prompts up to 48)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--threads", type=int, default=4, help="torch CPU threads (the torch backend runs there)"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu, or on a machine with a GPU")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="megatron-bench-") as tmp:
        root = Path(tmp)
        ckpt = build_hf_model(
            root / "model",
            family="qwen2",
            tied=True,
            vocab=args.vocab,
            heads=8,
            kv_heads=2,
            hidden=args.hidden,
            ffn=args.hidden * 11 // 4,
            layers=args.layers,
        )
        _, rollout = synthetic_rollout(
            root / "rollout.parquet",
            vocab=args.vocab,
            groups=args.samples // 4,
            prompt_len=(16, 48),
            response_len=(args.response // 4, args.response),
        )
        half = args.samples // 2
        cfg = run_config(ckpt, samples=args.samples, global_batch_size=half, micro_batch_size=half // 2)
        cfg = cfg.model_copy(update={"num_threads": args.threads})
        mcfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"train_backend": "megatron"})})
        port = free_port()

        torch_t = TorchTrainer(trainer_settings(cfg), str(ckpt), 0, 1)
        _, t_setup = _timed("cpu", lambda: torch_t.setup("127.0.0.1", port))
        mega = MegatronTrainer(trainer_settings(mcfg), str(ckpt), 0, 1, device=args.device)
        _, m_setup = _timed(args.device, lambda: mega.setup("127.0.0.1", port))

        lp_t, t_lp = _timed("cpu", lambda: torch_t.compute_log_probs(rollout, str(root / "lp_torch.parquet")))
        lp_m, m_lp = _timed(
            args.device, lambda: mega.compute_log_probs(rollout, str(root / "lp_mega.parquet"))
        )
        assert lp_t is not None and lp_m is not None  # rank 0 of a world of one writes them
        steps_t, t_train = _timed("cpu", lambda: torch_t.train_step(rollout, lp_t))
        steps_m, m_train = _timed(args.device, lambda: mega.train_step(rollout, lp_m))

        rows_t, rows_m = log_prob_rows(lp_t), log_prob_rows(lp_m)
        print(
            f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
            f"{sum(p.numel() for p in mega.params) / 1e6:.2f}M params; rollout {args.samples} samples, "
            f"responses up to {args.response}; megatron on {mega.device}, "
            f"torch on cpu ({args.threads} threads)"
        )
        print("\nmax |megatron - torch| (bound 1e-5)")
        for key in ("log_probs", "entropy", "ref_log_probs"):
            print(f"  {key:<43} {max_row_diff(rows_t, rows_m, key):.3g}")
        for a, b in zip(steps_t, steps_m, strict=True):
            for key in sorted(a):
                print(f"  step {a['train/step']} {key:<36} {abs(a[key] - b[key]):.3g}   (torch {a[key]:.6g})")
        weights_t, weights_m = torch_t.export_weights(), mega.export_weights()
        print(
            f"  weights after the rollout                   "
            f"{max((weights_t[k] - weights_m[k]).abs().max().item() for k in weights_t):.3g}"
        )
        print("\nseconds            torch(cpu)   megatron")
        for stage, torch_s, mega_s in (
            ("setup", t_setup, m_setup),
            ("log-probs", t_lp, m_lp),
            ("train step", t_train, m_train),
        ):
            print(f"  {stage:<16} {torch_s:>10.3f} {mega_s:>10.3f}")


if __name__ == "__main__":
    main()
