"""Small helpers shared by test modules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from artifacts import Sample


def float32_list(values: list[float]) -> list[float]:
    """Python floats holding exact float32 values, as ``tensor.tolist()`` returns them."""
    return np.asarray(values, dtype=np.float32).tolist()


def make_sample(index: int = 0, n: int = 4, vocab: int = 50_000, **changes: object) -> Sample:
    """A valid sample with `n` response tokens drawn from `vocab` (seeded by `index`); `changes` override fields."""
    rng = np.random.default_rng(index)
    sample = Sample(
        rollout_id=7,
        group_index=index // 2,
        sample_index=index,
        prompt=f"What is {index} + 1?",
        prompt_tokens=list(range(10, 20)),
        response="x" * n,
        response_tokens=rng.integers(0, vocab, n).tolist(),
        response_length=n,
        label=str(index + 1),
        reward=float(index % 2),
        status="completed",
        loss_mask=[1] * n,
        rollout_log_probs=float32_list((-rng.random(n) * 5).tolist()),
        weight_version=3,
        seed=1234 + index,
        metadata={"source": "tiny-arith", "turn": index},
    )
    return dataclasses.replace(sample, **changes)


def wandb_records(path: str) -> list:
    """The records of a W&B transaction log (`run-<id>.wandb`) as `wandb_internal_pb2.Record` messages.

    The file is a LevelDB-style log, as wandb-core writes it: a 7-byte header (`:W&B`, magic, version), then
    32 KiB blocks of chunks, each with a 7-byte header (CRC32C, little-endian length, type: 1 full, 2 first,
    3 middle, 4 last); a block's tail shorter than a header is zero padding."""
    import struct

    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:  # zero padding up to the end of the block
            pos += left - 7 - length
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def fail_second_scheduler_step(trainer: Any) -> Callable[[], None]:
    """Make `trainer`'s second LR-scheduler step of a rollout raise "planted failure": the optimizer step before it
    has moved weights and AdamW's moments by then. Returns what puts the real step back."""
    real_step, calls = trainer.scheduler.step, []

    def failing_step() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planted failure")
        real_step()

    trainer.scheduler.step = failing_step
    return lambda: setattr(trainer.scheduler, "step", real_step)
