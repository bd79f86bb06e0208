"""Pure helpers that turn rollout samples into the trainer's padded tensors and its step schedule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from artifacts.schema import Sample


def schedule(num_samples: int, global_batch_size: int, dp_size: int, rank: int,
             micro_batch_size: int) -> list[list[list[int]]]:
    """Positions (into the rollout's samples, ordered by sample_index) each rank works on.

    Returns steps -> micro-batches -> sample positions. Step s covers samples
    [s*gbs, (s+1)*gbs); rank r takes the r-th contiguous 1/dp of it, cut into micro-batches.
    So DP=1 with two micro-batches and DP=2 with one each see the same micro-batches.
    """
    per_rank = global_batch_size // dp_size
    steps = []
    for start in range(0, num_samples, global_batch_size):
        mine = list(range(start + rank * per_rank, start + (rank + 1) * per_rank))
        steps.append([mine[i:i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)])
    return steps


@dataclass
class MicroBatch:
    """Right-padded tensors of one micro-batch. T_all = longest prompt+response, T = longest response."""

    input_ids: torch.Tensor       # [B, T_all] int64
    attention_mask: torch.Tensor  # [B, T_all] int64
    response_index: torch.Tensor  # [B, T] int64: position in input_ids whose logits predict response token t
    response_tokens: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor       # [B, T] float32 (0 on padding)
    sample_index: list[int]


def make_micro_batch(samples: list[Sample], pad_id: int) -> MicroBatch:
    """Concatenate prompt and response tokens per sample and pad on the right."""
    seqs = [list(s.prompt_tokens) + list(s.response_tokens) for s in samples]
    width = max(len(x) for x in seqs)
    t = max(max(s.response_length for s in samples), 1)
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    response_index = torch.zeros((b, t), dtype=torch.long)
    response_tokens = torch.full((b, t), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, t), dtype=torch.float32)
    for i, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
        input_ids[i, :len(seq)] = torch.tensor(seq)
        attention[i, :len(seq)] = 1
        p, r = len(s.prompt_tokens), s.response_length
        if r:
            response_index[i, :r] = torch.arange(p - 1, p - 1 + r)
            response_tokens[i, :r] = torch.tensor(s.response_tokens)
            loss_mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return MicroBatch(input_ids, attention, response_index, response_tokens, loss_mask,
                      [s.sample_index for s in samples])


def pad_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] float32 from ragged rows, zero padded."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
    return out
