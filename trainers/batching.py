"""Pure helpers that turn rollout samples into the trainer's padded tensors and its step schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from artifacts.schema import Sample


def schedule(
    num_samples: int, global_batch_size: int, dp_size: int, rank: int, micro_batch_size: int
) -> list[list[list[int]]]:
    """Positions (into the rollout's samples, ordered by sample_index) each rank works on.

    Returns steps -> micro-batches -> sample positions. Step s covers samples
    [s*gbs, (s+1)*gbs); rank r takes the r-th contiguous 1/dp of it, cut into micro-batches.
    So DP=1 with two micro-batches and DP=2 with one each see the same micro-batches.
    """
    per_rank = global_batch_size // dp_size
    steps = []
    for start in range(0, num_samples, global_batch_size):
        mine = list(range(start + rank * per_rank, start + (rank + 1) * per_rank))
        steps.append([mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)])
    return steps


@dataclass
class Bucket:
    """Samples of one micro-batch of similar length, run in one forward of their own (see length_buckets).
    n = their real response tokens, sample by sample."""

    rows: torch.Tensor  # [b] int64: rows of the micro-batch, ascending length
    width: int  # longest prompt+response among them: the forward's sequence length
    source: torch.Tensor  # [n] int64: index into the forward's flattened [b, width] positions of the one
    # predicting each response token
    target: torch.Tensor  # [n] int64: where that token sits in the micro-batch's flattened [B, T] layout
    tokens: torch.Tensor  # [n] int64: the response token itself


@dataclass
class SharedPrompts:
    """One micro-batch laid out as its distinct prompts + each sample's response (see
    trainers/torch_trainer/shared_prompt.py), packed: M rows, one per real token, the distinct prompts' tokens
    first and then each sample's response inputs (a response's last token is never an input).
    For attention the rows are unpacked into G prompts left padded to P and B response inputs right padded to R;
    N real response tokens are predicted."""

    ids: torch.Tensor  # [M] int64: the packed tokens
    pos: torch.Tensor  # [M] int64: their rotary positions
    unpack: torch.Tensor  # [G*P + B*R] int64: each padded slot's row (prompts, then responses); M: padding
    pack: torch.Tensor  # [M] int64: the padded slot of each row (unpack[pack[m]] == m)
    prompt_valid: torch.Tensor  # [G, P] bool
    group: torch.Tensor  # [B] int64: each sample's prompt
    response_len: int  # R
    source: torch.Tensor  # [N] int64: the row whose hidden state predicts each response token
    target: torch.Tensor  # [N] int64: where that token sits in the micro-batch's flattened [B, T] layout
    tokens: torch.Tensor  # [N] int64

    @staticmethod
    def build(samples: list[Sample], t: int, padded_cost: int) -> SharedPrompts | None:
        """The layout of `samples` (T = the longest response), or None when it would not cost fewer token
        positions than `padded_cost` (what the length-bucketed forwards cost)."""
        prompts: dict[tuple[int, ...], int] = {}
        group = [prompts.setdefault(tuple(s.prompt_tokens), len(prompts)) for s in samples]
        width = max(len(p) for p in prompts)
        r = max(max(s.response_length for s in samples) - 1, 0)
        # a prompt part and a response part: two forwards' worth of per-call cost. Counted padded: attention runs
        # on the padded layout (the packed rows make only the token-wise operations cheaper). On long, spread
        # responses the length buckets' causal kernels beat it.
        if r == 0 or len(prompts) * width + len(samples) * r + 2 * FORWARD_OVERHEAD_TOKENS >= padded_cost:
            return None
        ids: list[int] = []
        pos: list[int] = []
        pack: list[int] = []
        # each prompt's first row; its last row predicts its samples' response token 0
        first_row: list[int] = []
        for g, prompt in enumerate(prompts):
            first_row.append(len(ids))
            ids.extend(prompt)
            pos.extend(range(len(prompt)))
            pack.extend(range(g * width + width - len(prompt), (g + 1) * width))  # left padded
        source: list[int] = []
        target: list[int] = []
        tokens: list[int] = []
        base = len(prompts) * width
        for b, s in enumerate(samples):
            p, n, row = len(s.prompt_tokens), s.response_length, len(ids)
            inputs = s.response_tokens[: max(n - 1, 0)]
            ids.extend(inputs)
            pos.extend(range(p, p + len(inputs)))
            pack.extend(range(base + b * r, base + b * r + len(inputs)))  # right padded
            if n:
                source.append(first_row[group[b]] + p - 1)
                source.extend(range(row, row + n - 1))
            target.extend(range(b * t, b * t + n))
            tokens.extend(s.response_tokens)
        unpack = [len(ids)] * (base + len(samples) * r)  # len(ids) = M: the zero row
        for row, slot in enumerate(pack):
            unpack[slot] = row
        long = torch.long
        return SharedPrompts(
            torch.tensor(ids, dtype=long),
            torch.tensor(pos, dtype=long),
            torch.tensor(unpack, dtype=long),
            torch.tensor(pack, dtype=long),
            torch.tensor([[i >= width - len(p) for i in range(width)] for p in prompts]),
            torch.tensor(group, dtype=long),
            r,
            torch.tensor(source, dtype=long),
            torch.tensor(target, dtype=long),
            torch.tensor(tokens, dtype=long),
        )


@dataclass
class MicroBatch:
    """Right-padded tensors of one micro-batch. T_all = longest prompt+response, T = longest response.

    No attention mask: with padding on the right and causal attention, every real token attends only
    to real tokens before it. So a mask changes nothing the trainer reads: pad positions' outputs are
    never gathered. Without one, SDPA takes its causal kernel. tests/unit/test_batching.py pins that the
    response logits are bitwise those of the masked forward."""

    input_ids: torch.Tensor  # [B, T_all] int64
    response_index: torch.Tensor  # [B, T] int64: position in input_ids whose logits predict response token t
    response_tokens: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor  # [B, T] float32 (0 on padding)
    sample_index: list[int]
    buckets: list[Bucket]  # the same samples cut by length (a backend may run one forward per bucket)
    shared: SharedPrompts | None  # or laid out by distinct prompt, when that costs fewer positions


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
    cuts = length_buckets([len(x) for x in seqs])
    padded = sum(len(rows) * max(len(seqs[i]) for i in rows) + FORWARD_OVERHEAD_TOKENS for rows in cuts)
    return MicroBatch(
        input_ids,
        torch.tensor(response_index, dtype=torch.long),
        torch.tensor(response_tokens, dtype=torch.long),
        torch.tensor(loss_mask, dtype=torch.float32),
        [s.sample_index for s in samples],
        [_bucket(samples, rows, t) for rows in cuts],
        SharedPrompts.build(samples, t, padded),
    )


def _bucket(samples: list[Sample], rows: list[int], t: int) -> Bucket:
    width = max(len(samples[b].prompt_tokens) + samples[b].response_length for b in rows)
    source: list[int] = []
    target: list[int] = []
    tokens: list[int] = []
    for i, b in enumerate(rows):
        s = samples[b]
        p, r = len(s.prompt_tokens), s.response_length
        source.extend(range(i * width + p - 1, i * width + p - 1 + r))
        target.extend(range(b * t, b * t + r))
        tokens.extend(s.response_tokens)
    return Bucket(
        torch.tensor(rows, dtype=torch.long),
        width,
        torch.tensor(source, dtype=torch.long),
        torch.tensor(target, dtype=torch.long),
        torch.tensor(tokens, dtype=torch.long),
    )


# What one more forward/backward costs beyond its tokens, counted in padded tokens: on a 2-core CPU a small
# model's per-call cost (Python, kernel launches, per-layer set-up) is worth a few hundred tokens.
FORWARD_OVERHEAD_TOKENS = 256


def length_buckets(lengths: list[int], overhead_tokens: int = FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Cut one micro-batch into forwards of samples of similar length, so that each is padded less.

    `lengths[i]` is sample i's prompt+response length. Samples sorted by (length, i) are cut into contiguous
    buckets minimising sum(bucket size x its longest) + overhead_tokens x buckets, i.e. padded tokens plus a
    per-forward cost (exactly: dynamic programming over the cut points, O(n^2) for n samples). A function of
    the lengths alone, so every run and every rank cuts the same micro-batch the same way.
    Returns the buckets, shortest first, each a list of indices into `lengths` by ascending length.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = [0] * (n + 1)  # best[j]: the cost of the first j sorted samples
    cut = [0] * (n + 1)  # cut[j]: where the last bucket of those j starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * longest + overhead_tokens, i) for i in range(j))
    buckets, j = [], n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


def pad_rows(rows: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] float32 from ragged rows (each at most `width` long), zero padded."""
    return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32).reshape(
        len(rows), width
    )


@dataclass(frozen=True)
class ModelShape:
    """What a forward's cost depends on (an HF config.json's sizes), for --balance-data."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int

    @staticmethod
    def from_hf_config(config: dict[str, Any]) -> ModelShape:
        heads = int(config["num_attention_heads"])
        return ModelShape(
            hidden=int(config["hidden_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            ffn=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            vocab=int(config["vocab_size"]),
        )


def forward_flops(length: int, m: ModelShape) -> int:
    """Estimated FLOPs of one sequence's forward through a dense gated-MLP decoder, as slime estimates them:
    per layer the q/kv projections, causal attention (quadratic in `length`), the output projection and the
    three MLP matmuls; then the output layer."""
    qkv = 2 * length * m.hidden * m.heads * m.head_dim + 4 * length * m.hidden * m.kv_heads * m.head_dim
    attention = 2 * m.heads * m.head_dim * length * length
    out = 2 * length * m.hidden * m.hidden
    mlp = 6 * length * m.hidden * m.ffn
    return (qkv + attention + out + mlp) * m.layers + 2 * length * m.hidden * m.vocab


def first_fit(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of `lengths`, in order, each into the first bin whose token sum stays within `budget` (a new
    bin when none has room; a length over the budget gets a bin of its own)."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i, n in enumerate(lengths):
        for b, total in enumerate(sums):
            if total + n <= budget:
                bins[b].append(i)
                sums[b] += n
                break
        else:
            bins.append([i])
            sums.append(n)
    return bins


def split_to_count(bins: list[list[int]], count: int, lengths: list[int]) -> list[list[int]]:
    """Split the bin with the most tokens (of those with two samples or more) into two halves of about equal
    tokens, longest samples first each to the lighter half, until there are `count` bins (ValueError when
    every bin already holds one sample). Halves keep their samples in index order."""
    bins = [list(b) for b in bins]
    while len(bins) < count:
        splittable = [(sum(lengths[i] for i in b), k) for k, b in enumerate(bins) if len(b) > 1]
        if not splittable:
            raise ValueError(f"cannot make {count} micro-batches of {sum(len(b) for b in bins)} samples")
        _, k = max(splittable)
        halves: list[list[int]] = [[], []]
        weight = [0, 0]
        for i in sorted(bins[k], key=lambda i: (-lengths[i], i)):
            h = 0 if weight[0] <= weight[1] else 1
            halves[h].append(i)
            weight[h] += lengths[i]
        bins[k] = sorted(halves[0])
        bins.append(sorted(halves[1]))
    return bins


def balanced_partition(weights: list[int], parts: int) -> list[list[int]]:
    """Karmarkar-Karp (largest differencing) partition of the indices of `weights` into `parts` sets of equal
    size (len(weights) must be a multiple of `parts`) with sums as equal as it finds; each set in index order,
    the sets ordered by their smallest index.

    The items, sorted by (weight, index), are dealt in consecutive runs of `parts`, one partial solution each;
    the two partial solutions with the widest spread are merged repeatedly, the heaviest set of one joined to the
    lightest of the other, until one remains."""
    if len(weights) % parts:
        raise ValueError(f"{len(weights)} items do not split into {parts} equal parts")
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    # a partial solution: `parts` sets as (sum, items), heaviest first
    states = []
    for start in range(0, len(order), parts):
        sets = sorted(((weights[i], [i]) for i in order[start : start + parts]), key=lambda s: (-s[0], s[1]))
        states.append(sets)

    def spread(sets: list[tuple[int, list[int]]]) -> int:
        return sets[0][0] - sets[-1][0]

    while len(states) > 1:
        states.sort(key=lambda st: (spread(st), st[0][0], [i for _, items in st for i in items]))
        a, b = states.pop(), states.pop()  # the two widest spreads
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)]
        states.append(sorted(merged, key=lambda s: (-s[0], sorted(s[1]))))
    return sorted((sorted(items) for _, items in states[0]), key=lambda items: items[0])


def token_schedule(
    lengths: list[int],
    global_batch_size: int,
    dp_size: int,
    rank: int,
    *,
    micro_batch_size: int,
    max_tokens: int | None = None,
    workloads: list[int] | None = None,
) -> list[list[list[int]]]:
    """slime's schedule of `lengths` (prompt+response tokens of the rollout's samples, ordered by
    sample_index): steps of `global_batch_size` consecutive samples; each step packed into micro-batches,
    first-fit by tokens within `max_tokens` (--use-dynamic-batch-size) or in consecutive runs of
    `micro_batch_size`; with max_tokens, more are split off until their number is a multiple of `dp_size`;
    then handed to the ranks in turn, or, given `workloads` (per sample, --balance-data), by
    `balanced_partition` of the micro-batches' summed workloads. Returns this rank's steps -> micro-batches ->
    sample positions. Every rank gets the same number of micro-batches a step."""
    steps = []
    for start in range(0, len(lengths), global_batch_size):
        positions = list(range(start, min(start + global_batch_size, len(lengths))))
        step_lengths = [lengths[p] for p in positions]
        if max_tokens is not None:
            bins = first_fit(step_lengths, max_tokens)
            wanted = max(-(-len(bins) // dp_size) * dp_size, dp_size)
            bins = split_to_count(bins, wanted, step_lengths)
        else:
            bins = [
                list(range(i, min(i + micro_batch_size, len(positions))))
                for i in range(0, len(positions), micro_batch_size)
            ]
            if len(bins) % dp_size:
                raise ValueError(
                    f"{len(bins)} micro-batches of {micro_batch_size} do not split over {dp_size} ranks"
                )
        if workloads is not None:
            mine = balanced_partition([sum(workloads[positions[i]] for i in b) for b in bins], dp_size)[rank]
        else:
            mine = list(range(rank, len(bins), dp_size))
        steps.append([[positions[i] for i in bins[k]] for k in mine])
    return steps
