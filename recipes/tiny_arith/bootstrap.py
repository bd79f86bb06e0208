"""Cached warm-up checkpoint for tiny-arith.

RL from a random init would never see a reward, so ``ensure_checkpoint`` first runs a
short supervised warm-up and deliberately *stops early* (a fixed 500 steps): the model then
solves about 40% of the held-out problems when sampling at temperature 1.0 and about 64%
greedily, which leaves GRPO room to climb.

The warm-up trains in float64 and rounds to float32 once, at the end. In float32 the
result depended on the CPU: matmul kernels (AVX2, AVX-512, AMX) sum in different orders,
Adam amplifies those last-bit differences over hundreds of steps, and the warm-up models
of three machines sampled at 0.25-0.27 and decoded greedily at 0.45-0.55. In float64 the
drift stays around 1e-7 after rounding: built with 1 and 2 threads (different reduction
orders), the two models score the same accuracies to four digits. A fixed step count
replaces the earlier "stop at a target accuracy" rule, whose 25-step granularity turned
such small differences into 25 more or fewer steps of training.

Contract of ``ensure_checkpoint(cache_dir=None, settings=None, *, num_threads=1)``:
    * Returns ``<cache>/tiny-arith-<fingerprint>/`` holding an HF checkpoint
      (``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer
      files, ``bootstrap_info.json``) and a ``DONE`` marker.
    * ``<cache>`` is ``cache_dir``, else ``$ROLLFLOW_CACHE_DIR``, else ``~/.cache/rollflow``.
    * The fingerprint covers ``RECIPE_VERSION``, the warm-up settings, the model config
      and the tokenizer fingerprint, so changing any of them builds a new checkpoint.
    * Built at most once per fingerprint: callers serialise on ``<cache>/tiny-arith.lock``
      (``fcntl.flock``); the build happens in a temp dir beside the target and is
      published with ``os.rename`` only after ``DONE`` is written.
    * The caller's torch thread count and global RNG state are restored afterwards.

Run ``python -m recipes.tiny_arith.bootstrap [--cache-dir D] [--num-threads N]`` to build
and print the path.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from recipes.tiny_arith.data import all_problems, eval_problems, make_problems
from recipes.tiny_arith.model import build_model, model_config
from recipes.tiny_arith.reward import accuracy
from recipes.tiny_arith.settings import (  # noqa: F401  (re-exported: the cache contract lives in settings)
    CACHE_ENV_VAR,
    RECIPE_VERSION,
    WarmupSettings,
    checkpoint_path,
    default_cache_dir,
    recipe_fingerprint,
)
from recipes.tiny_arith.tokenizer import build_tokenizer
from recipes.warmup import (  # noqa: F401  (re-exported)
    DONE_MARKER,
    INFO_FILE,
    build_once,
    cli,
    generate_responses,
    save_checkpoint,
    sft_tensors,
)

LOCK_FILE = "tiny-arith.lock"


def sample_accuracy(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    problems: Sequence[dict[str, str]],
    temperature: float,
    seed: int,
    max_new_tokens: int = 5,
) -> float:
    """pass@1 with one response per problem (greedy when ``temperature <= 0``)."""
    responses = generate_responses(
        model, tok, [p["question"] for p in problems], temperature, seed, max_new_tokens
    )
    return accuracy(responses, [p["label"] for p in problems])


def train_warmup(
    tok: PreTrainedTokenizerBase,
    settings: WarmupSettings,
    log: Callable[[str], None] = print,
) -> tuple[Qwen2ForCausalLM, dict[str, object]]:
    """SFT for ``settings.steps`` steps in float64; returns the float32 model and a summary.

    Deterministic for fixed ``settings``, and (being float64) the same to about 1e-7 under
    other thread counts and CPU kernels; the caller owns RNG/thread bookkeeping.
    """
    val = make_problems(settings.val_size, settings.val_seed, "train")
    val_questions = {p["question"] for p in val}
    # Train on the rest of the train split so the progress line measures generalisation.
    pool = [p for p in all_problems("train") if p["question"] not in val_questions]
    input_ids, attention_mask, labels = sft_tensors(tok, pool)

    model = build_model(model_config(len(tok)), settings.model_seed).to(torch.float64)  # type: ignore[arg-type]
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98), weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, settings.warmup_steps))
    )
    batches = torch.Generator().manual_seed(settings.data_seed)

    val_acc, running = 0.0, 0.0
    for step in range(1, settings.steps + 1):
        idx = torch.randint(len(pool), (settings.batch_size,), generator=batches)
        loss = model(input_ids=input_ids[idx], attention_mask=attention_mask[idx], labels=labels[idx]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        running += loss.item()
        if step % settings.log_every == 0 or step == settings.steps:
            val_acc = sample_accuracy(model, tok, val, settings.temperature, settings.sample_seed)
            log(
                f"[tiny-arith warm-up] step {step:4d}/{settings.steps}  loss {running / ((step - 1) % settings.log_every + 1):.3f}  "
                f"sampled val acc {val_acc:.3f}"
            )
            running = 0.0
    model = model.to(torch.float32)  # the only rounding: see the module docstring  # type: ignore[arg-type]
    model.eval()
    return model, {"steps": settings.steps, "val_sampled_accuracy": val_acc}


def _build(
    target: pathlib.Path,
    tok: PreTrainedTokenizerBase,
    settings: WarmupSettings,
    fingerprint: str,
    log: Callable[[str], None],
) -> None:
    """Train and write a complete checkpoint (with ``DONE``) into ``target``."""
    started = time.perf_counter()
    model, summary = train_warmup(tok, settings, log)
    evals = eval_problems()
    sampled = sample_accuracy(model, tok, evals, settings.temperature, settings.sample_seed)
    greedy = sample_accuracy(model, tok, evals, 0.0, settings.sample_seed)
    seconds = time.perf_counter() - started

    info = {
        "recipe_version": RECIPE_VERSION,
        "fingerprint": fingerprint,
        "settings": dataclasses.asdict(settings),
        **summary,
        "eval_set_size": len(evals),
        "eval_sampled_accuracy": sampled,
        "eval_greedy_accuracy": greedy,
        "seconds": round(seconds, 2),
    }
    save_checkpoint(target, model, tok, info, fingerprint)
    log(
        f"[tiny-arith warm-up] done: {summary['steps']} steps in {seconds:.1f}s, eval "
        f"sampled acc {sampled:.3f}, greedy acc {greedy:.3f}"
    )


def ensure_checkpoint(
    cache_dir: str | os.PathLike[str] | None = None,
    settings: WarmupSettings | None = None,
    *,
    num_threads: int = 1,
    verbose: bool = True,
) -> pathlib.Path:
    """Return the warm-up checkpoint directory, building it first if needed (see module doc).

    ``num_threads`` defaults to 1: this model is too small for intra-op parallelism to pay,
    and with any background load OpenMP barriers make two threads several times slower.
    Thread count can change float reduction order: the shipped settings gave identical
    results with 1 and 2 threads, but an lr=3e-3 trial diverged. It is recorded in
    ``bootstrap_info.json`` rather than the cache key, so the first build wins.
    """
    settings = settings or WarmupSettings()
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tok = build_tokenizer()
    fingerprint = recipe_fingerprint(settings, tok)
    final = checkpoint_path(cache, settings)
    if (final / DONE_MARKER).exists():
        return final

    def log(message: str) -> None:
        if verbose:
            print(message, flush=True)

    return build_once(
        final,
        cache / LOCK_FILE,
        lambda tmp: _build(tmp, tok, settings, fingerprint, log),
        num_threads=num_threads,
        log=log,
        tag="tiny-arith",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Build (or find) the checkpoint and print its path (recipes.warmup.cli)."""
    cli("tiny-arith", ensure_checkpoint, argv)


if __name__ == "__main__":
    main()
