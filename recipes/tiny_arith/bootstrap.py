"""Cached warm-up checkpoint for tiny-arith.

RL from a random init would never see a reward, so ``ensure_checkpoint`` first runs a
short supervised warm-up and deliberately *stops early* (a fixed 500 steps): the model then
solves about 40% of the held-out problems when sampling at temperature 1.0 and about 64%
greedily, which leaves GRPO room to climb (measured: +27 points in the default run).

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

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from recipes.tiny_arith.data import all_problems, eval_problems, format_prompt, make_problems
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

DONE_MARKER = "DONE"
INFO_FILE = "bootstrap_info.json"
LOCK_FILE = "tiny-arith.lock"

IGNORE_INDEX = -100


@contextlib.contextmanager
def _torch_threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def generate_responses(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerBase,
    questions: Sequence[str],
    temperature: float,
    seed: int,
    max_new_tokens: int = 5,
    batch_size: int = 256,
) -> list[str]:
    """Decode one response per question; ``temperature <= 0`` means greedy.

    Responses are cut at the first ``<eos>`` (kept in the text) so that padding produced
    for finished rows never leaks into them. The global RNG is seeded with ``seed`` for
    the duration of the call and then restored.
    """
    was_training = model.training
    model.eval()
    responses: list[str] = []
    sampling = temperature > 0
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        for start in range(0, len(questions), batch_size):
            prompts = [format_prompt(tok, q) for q in questions[start : start + batch_size]]
            ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
            width = max(len(x) for x in ids)
            # Left padding: every row's last prompt token sits in the final column.
            input_ids = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
            for row, seq in enumerate(ids):
                input_ids[row, width - len(seq) :] = torch.tensor(seq)
                attention_mask[row, width - len(seq) :] = 1
            sampling_kwargs = (
                {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if sampling
                else {"do_sample": False}
            )
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                **sampling_kwargs,
            )
            for new_tokens in out[:, width:].tolist():
                if tok.eos_token_id in new_tokens:
                    new_tokens = new_tokens[: new_tokens.index(tok.eos_token_id) + 1]
                responses.append(tok.decode(new_tokens, skip_special_tokens=False))  # type: ignore[arg-type]
    model.train(was_training)
    return responses


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


def _sft_tensors(
    tok: PreTrainedTokenizerBase, problems: Sequence[dict[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)``; loss only on ``label<eos>``."""
    rows: list[tuple[list[int], list[int]]] = []
    for p in problems:
        prompt = tok.encode(format_prompt(tok, p["question"]), add_special_tokens=False)
        response = tok.encode(p["label"], add_special_tokens=False) + [tok.eos_token_id]
        rows.append((prompt, response))
    width = max(len(a) + len(b) for a, b in rows)
    input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        n = len(prompt) + len(response)
        input_ids[i, :n] = torch.tensor(prompt + response)
        attention_mask[i, :n] = 1
        # HF causal-LM heads shift labels internally: labels align with input_ids.
        labels[i, len(prompt) : n] = torch.tensor(response)
    return input_ids, attention_mask, labels


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
    input_ids, attention_mask, labels = _sft_tensors(tok, pool)

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
            log(f"[tiny-arith warm-up] step {step:4d}/{settings.steps}  loss {running / ((step - 1) % settings.log_every + 1):.3f}  "
                f"sampled val acc {val_acc:.3f}")
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

    model.save_pretrained(target, safe_serialization=True)
    tok.save_pretrained(target)
    info = {
        "recipe_version": RECIPE_VERSION,
        "fingerprint": fingerprint,
        "settings": dataclasses.asdict(settings),
        **summary,
        "eval_set_size": len(evals),
        "eval_sampled_accuracy": sampled,
        "eval_greedy_accuracy": greedy,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "num_threads": torch.get_num_threads(),
        "seconds": round(seconds, 2),
    }
    (target / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    (target / DONE_MARKER).write_text(fingerprint + "\n")
    log(
        f"[tiny-arith warm-up] done: {summary['steps']} steps in {seconds:.1f}s, eval "
        f"sampled acc {sampled:.3f}, greedy acc {greedy:.3f}"
    )


def _publish(tmp: pathlib.Path, final: pathlib.Path) -> None:
    """Atomically move a finished build into place unless a complete one already exists."""
    if (final / DONE_MARKER).exists():
        return  # Someone (not honouring the lock, e.g. on NFS) won the race; keep theirs.
    if final.exists():
        # An incomplete directory cannot come from us (we rename only finished builds);
        # it is debris from a manual copy or a foreign tool, so replace it.
        shutil.rmtree(final)
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / DONE_MARKER).exists():
            raise


def ensure_checkpoint(
    cache_dir: str | os.PathLike[str] | None = None,
    settings: WarmupSettings | None = None,
    *,
    num_threads: int = 1,
    verbose: bool = True,
) -> pathlib.Path:
    """Return the warm-up checkpoint directory, building it first if needed (see module doc).

    ``num_threads`` defaults to 1: on the 2-core box one thread ran the warm-up in ~30 s
    against ~50 s with two (this model is too small for intra-op parallelism to pay, and
    with any background load OpenMP barriers make two threads several times slower).
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

    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / LOCK_FILE, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (final / DONE_MARKER).exists():  # Built while we waited for the lock.
                return final
            log(f"[tiny-arith warm-up] building {final}")
            tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=cache))
            try:
                with _torch_threads(num_threads), torch.random.fork_rng(devices=[]):
                    _build(tmp, tok, settings, fingerprint, log)
                # mkdtemp creates 0700; a cache may be shared between users/containers.
                tmp.chmod(0o755)
                for path in tmp.iterdir():
                    path.chmod(0o644)
                _publish(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (or find) the tiny-arith checkpoint.")
    parser.add_argument("--cache-dir", default=None, help=f"default: ${CACHE_ENV_VAR} or ~/.cache/rollflow")
    parser.add_argument("--num-threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(ensure_checkpoint(args.cache_dir, num_threads=args.num_threads))


if __name__ == "__main__":
    main()
