"""Cached warm-up checkpoint for long-arith.

``ensure_checkpoint`` runs a short supervised warm-up (``WarmupSettings.steps`` steps on fresh problems of the
train split, each batch of one digit count) so that the model writes the step-by-step format, stops after the
sum and so answers in 64-256 tokens; it is far from solving the long sums, which leaves RL room (the reward's
partial credit gives it a signal). Budget: at most ~5 minutes on the 2-core dev box.

It trains in float32, not in float64 as tiny-arith does: float64 would cost about twice the time on these
CPUs and break the budget, and this recipe exists to time the RL step and the engine on realistic shapes, not
to give the same learning curve on every machine. The price: the warm-up model (and the bench figures that
depend on its response lengths) may differ slightly between CPUs with different matmul kernels.

Contract of ``ensure_checkpoint(cache_dir=None, settings=None, *, num_threads=1)``: as tiny-arith's (see
``recipes.warmup``): ``<cache>/long-arith-<fingerprint>/`` with an HF checkpoint, ``bootstrap_info.json`` and a
``DONE`` marker; built at most once per fingerprint under ``<cache>/long-arith.lock`` in a temp dir published by
``os.rename``; the fingerprint covers ``RECIPE_VERSION``, the settings (model size included), the model config and
the tokenizer.

Run ``python -m recipes.long_arith.bootstrap [--cache-dir D] [--num-threads N]`` to build and print the path.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import random
import time
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from recipes.common import build_model, default_cache_dir
from recipes.long_arith.data import DIGITS, MAX_RESPONSE_TOKENS, eval_problems, make_problems
from recipes.long_arith.model import model_config
from recipes.long_arith.reward import mean_reward, reward
from recipes.long_arith.settings import RECIPE_VERSION, WarmupSettings, checkpoint_path, recipe_fingerprint
from recipes.long_arith.tokenizer import build_tokenizer
from recipes.warmup import build_once, cli, generate_responses, save_checkpoint, sft_tensors

LOCK_FILE = "long-arith.lock"


def score(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    problems: Sequence[dict[str, str]],
    temperature: float,
    seed: int,
) -> tuple[float, float]:
    """(mean reward, exact-answer fraction) of one response per problem (greedy when ``temperature <= 0``)."""
    responses = generate_responses(
        model,
        tok,
        [p["question"] for p in problems],
        temperature,
        seed,
        max_new_tokens=MAX_RESPONSE_TOKENS,
        batch_size=64,
    )
    labels = [p["label"] for p in problems]
    exact = sum(reward(r, y) == 1.0 for r, y in zip(responses, labels, strict=True)) / max(1, len(labels))
    return mean_reward(responses, labels), exact


def train_warmup(
    tok: PreTrainedTokenizerBase, settings: WarmupSettings, log: Callable[[str], None] = print
) -> tuple[Qwen2ForCausalLM, dict[str, object]]:
    """SFT for ``settings.steps`` steps in float32 (linear warm-up, then cosine decay to a tenth); returns the
    model and a summary. The caller owns RNG/thread bookkeeping."""
    val = make_problems(settings.val_size, seed=1, split="eval")
    model = build_model(model_config(len(tok), settings), settings.model_seed)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98), weight_decay=0.0
    )

    def lr_factor(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    rng = random.Random(settings.data_seed)
    val_reward, val_exact, running = 0.0, 0.0, 0.0
    for step in range(1, settings.steps + 1):
        batch = make_problems(
            settings.batch_size,
            seed=settings.data_seed * 1_000_000 + step,
            split="train",
            digits=rng.choice(DIGITS),
        )
        input_ids, attention_mask, labels = sft_tensors(tok, batch)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        running += loss.item()
        if step % settings.log_every == 0 or step == settings.steps:
            val_reward, val_exact = score(model, tok, val, settings.temperature, settings.sample_seed)
            log(
                f"[long-arith warm-up] step {step:4d}/{settings.steps}  loss "
                f"{running / ((step - 1) % settings.log_every + 1):.3f}  sampled val reward {val_reward:.3f} "
                f"(exact {val_exact:.3f})"
            )
            running = 0.0
    model.eval()
    return model, {"steps": settings.steps, "val_sampled_reward": val_reward, "val_sampled_exact": val_exact}


def _build(
    target: pathlib.Path,
    tok: PreTrainedTokenizerBase,
    settings: WarmupSettings,
    fingerprint: str,
    log: Callable[[str], None],
    eval_size: int | None,
) -> None:
    """Train and write a complete checkpoint (with ``DONE``) into ``target``."""
    started = time.perf_counter()
    model, summary = train_warmup(tok, settings, log)
    trained = time.perf_counter() - started
    evals = eval_problems()[:eval_size]
    sampled, exact = score(model, tok, evals, settings.temperature, settings.sample_seed)
    seconds = time.perf_counter() - started
    info = {
        "recipe_version": RECIPE_VERSION,
        "fingerprint": fingerprint,
        "settings": dataclasses.asdict(settings),
        **summary,
        "eval_set_size": len(evals),
        "eval_sampled_reward": sampled,
        "eval_sampled_exact": exact,
        "train_seconds": round(trained, 2),
        "seconds": round(seconds, 2),
    }
    save_checkpoint(target, model, tok, info, fingerprint)
    log(
        f"[long-arith warm-up] done: {settings.steps} steps in {trained:.1f}s ({seconds:.1f}s with the eval), "
        f"eval sampled reward {sampled:.3f}, exact {exact:.3f}"
    )


def ensure_checkpoint(
    cache_dir: str | os.PathLike[str] | None = None,
    settings: WarmupSettings | None = None,
    *,
    num_threads: int = 1,
    verbose: bool = True,
    eval_size: int | None = None,
) -> pathlib.Path:
    """Return the warm-up checkpoint directory, building it first if needed (see the module doc).

    ``num_threads`` defaults to 1: one thread's speed does not depend on the other cores' load, while two
    threads' OpenMP barriers wait for a descheduled thread on a shared machine (bench/HISTORY.md). The thread
    count can change float32 losses in the fourth digit. It is recorded in ``bootstrap_info.json``, not in the
    cache key, so the first build wins. ``eval_size`` limits the closing eval (tests).
    """
    settings = settings or WarmupSettings()
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tok = build_tokenizer()
    fingerprint = recipe_fingerprint(settings, tok)

    def log(message: str) -> None:
        if verbose:
            print(message, flush=True)

    return build_once(
        checkpoint_path(cache, settings),
        cache / LOCK_FILE,
        lambda tmp: _build(tmp, tok, settings, fingerprint, log, eval_size),
        num_threads=num_threads,
        log=log,
        tag="long-arith",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Build (or find) the checkpoint and print its path (recipes.warmup.cli)."""
    cli("long-arith", ensure_checkpoint, argv)


if __name__ == "__main__":
    main()
