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
    """Right-padded tensors of one micro-batch. T_all = longest prompt+response, T = longest response.

    No attention mask: with padding on the right and causal attention, every real token attends only
    to real tokens before it, so a mask changes nothing the trainer reads (pad positions' outputs are
    never gathered), and without one SDPA takes its causal kernel (tests/unit/test_batching.py pins
    that the response logits are bitwise those of the masked forward)."""

    input_ids: torch.Tensor       # [B, T_all] int64
    response_index: torch.Tensor  # [B, T] int64: position in input_ids whose logits predict response token t
    response_tokens: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor       # [B, T] float32 (0 on padding)
    sample_index: list[int]


def make_micro_batch(samples: list[Sample], pad_id: int) -> MicroBatch:
    """Concatenate prompt and response tokens per sample and pad on the right."""
    seqs = [list(s.prompt_tokens) + list(s.response_tokens) for s in samples]
    width = max(len(x) for x in seqs)
    t = max(max(s.response_length for s in samples), 1)
    # one torch.tensor call per field (not per sample): this runs on every trainer micro-batch
    input_ids = torch.tensor([x + [pad_id] * (width - len(x)) for x in seqs], dtype=torch.long)
    response_index, response_tokens, loss_mask = [], [], []
    for s in samples:
        p, r = len(s.prompt_tokens), s.response_length
        response_index.append(list(range(p - 1, p - 1 + r)) + [0] * (t - r))
        response_tokens.append(list(s.response_tokens) + [pad_id] * (t - r))
        loss_mask.append([float(m) for m in s.loss_mask] + [0.0] * (t - r))
    return MicroBatch(input_ids, torch.tensor(response_index, dtype=torch.long),
                      torch.tensor(response_tokens, dtype=torch.long),
                      torch.tensor(loss_mask, dtype=torch.float32), [s.sample_index for s in samples])


def pad_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] float32 from ragged rows (each at most `width` long), zero padded."""
    return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32).reshape(len(rows), width)
