"""The recipes' warm-up machinery (needs torch): batched sampling for progress lines and evals, SFT tensors,
and building a checkpoint at most once per fingerprint into the model cache.

Contract of ``build_once(final, lock_file, build, *, num_threads, log)``:
    * Returns ``final`` once it holds a ``DONE`` marker; ``build(tmp)`` is called only when it does not.
    * Callers serialise on ``lock_file`` (``fcntl.flock``); the build happens in a temp dir beside ``final``
      and is published with ``os.rename`` only after ``build`` has written everything (``DONE`` included).
    * The caller's torch thread count and global RNG state are restored afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from recipes.common import DONE_MARKER, format_prompt

INFO_FILE = "bootstrap_info.json"
IGNORE_INDEX = -100


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def generate_responses(
    model: PreTrainedModel,
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
            out = model.generate(  # type: ignore[operator]
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


def sft_tensors(
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


def build_once(
    final: pathlib.Path,
    lock_file: pathlib.Path,
    build: Callable[[pathlib.Path], None],
    *,
    num_threads: int,
    log: Callable[[str], None],
    tag: str,
) -> pathlib.Path:
    """Build ``final`` with ``build(tmp_dir)`` unless it is already complete (see the module doc)."""
    if (final / DONE_MARKER).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (final / DONE_MARKER).exists():  # Built while we waited for the lock.
                return final
            log(f"[{tag} warm-up] building {final}")
            tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
            try:
                with torch_threads(num_threads), torch.random.fork_rng(devices=[]):
                    build(tmp)
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


def save_checkpoint(
    target: pathlib.Path,
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    info: dict[str, object],
    fingerprint: str,
) -> None:
    """Write the HF checkpoint, ``bootstrap_info.json`` (with the parameter and thread counts added) and, last,
    the ``DONE`` marker into ``target``."""
    import json

    model.save_pretrained(target, safe_serialization=True)
    tok.save_pretrained(target)
    info = {
        **info,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "num_threads": torch.get_num_threads(),
    }
    (target / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    (target / DONE_MARKER).write_text(fingerprint + "\n")


def cli(name: str, ensure_checkpoint: Callable[..., pathlib.Path], argv: Sequence[str] | None = None) -> None:
    """`python -m recipes.<name>.bootstrap [--cache-dir D] [--num-threads N]`: build (or find) the recipe's
    checkpoint and print its path."""
    parser = argparse.ArgumentParser(description=f"Build (or find) the {name} checkpoint.")
    parser.add_argument("--cache-dir", default=None, help="default: $ROLLFLOW_CACHE_DIR or ~/.cache/rollflow")
    parser.add_argument("--num-threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(ensure_checkpoint(args.cache_dir, num_threads=args.num_threads))
