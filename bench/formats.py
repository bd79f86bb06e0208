"""Rollout file formats: our Parquet against slime's ``.pt`` pickle, load seconds and bytes.

One recorded rollout of N samples (N = each ``--sizes`` entry) is written both ways:
  parquet  ``artifacts.store.write_rollout`` (zstd from 64 KiB of content, page CRCs, content checksum);
  pt       ``artifacts.slime_format.save_slime_dump`` (``torch.save`` of slime sample dicts).
Load = read back into a ``list[Sample]``: ``read_rollout`` against ``load_slime_dump`` (which
uses ``torch.load(weights_only=True)``, the safe loader). Best of ``--repeats`` runs each.

Rows are tiny-arith-like: ``<|user|>a+b=<|assistant|>`` (~8 prompt tokens), the answer digits
plus EOS (3-5 response tokens), float32 log-probs, 63-bit seeds, ``{"finish_reason": ...}``
metadata. ``--long K`` adds a variant whose responses have K tokens (prompt unchanged).

A second table splits each load into its stages, to show where the time goes:
  parquet: file -> Arrow table without checks (``read_table(verify=False)``), the content
           checksum (``table_content_sha256``), Arrow -> ``Sample`` (``table_to_samples``);
  pt:      ``torch.load(weights_only=True)``, ``torch.load(weights_only=False)`` (plain pickle,
           unsafe, for comparison), slime dict -> ``Sample`` (incl. ``Sample.validate``).

    python bench/formats.py [--sizes 1000,10000] [--repeats 5] [--long 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifacts.schema import Sample, table_to_samples  # noqa: E402
from artifacts.slime_format import _slime_to_sample, load_slime_dump, save_slime_dump  # noqa: E402
from artifacts.store import read_rollout, read_table, table_content_sha256, write_rollout  # noqa: E402
from bench._table import table  # noqa: E402

# tiny-arith's character-level vocabulary (recipes/tiny_arith/tokenizer.py)
EOS, USER, ASSISTANT, PLUS, EQUALS = 1, 2, 3, 14, 16
DIGIT = {str(d): 4 + d for d in range(10)}


def _digits(text: str) -> list[int]:
    return [DIGIT[c] for c in text]


def make_rollout(n: int, long: int = 0, rollout_id: int = 3, seed: int = 0) -> list[Sample]:
    """``n`` tiny-arith-like samples (8 per prompt group); ``long`` > 0 gives ``long``-token responses."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        prompt_tokens = [USER, *_digits(str(a)), PLUS, *_digits(str(b)), EQUALS, ASSISTANT]
        answer = str(max(0, a + b + rng.choice((0, 0, 0, 1, -1))))  # mostly right, sometimes off by one
        if long:
            response_tokens = [rng.randrange(4, 18) for _ in range(long - 1)] + [EOS]
        else:
            response_tokens = [*_digits(answer), EOS]
        k = len(response_tokens)
        samples.append(
            Sample(
                rollout_id=rollout_id,
                group_index=i // 8,
                sample_index=i,
                prompt=f"<|user|>{a}+{b}=<|assistant|>",
                prompt_tokens=prompt_tokens,
                response=answer,
                response_tokens=response_tokens,
                response_length=k,
                label=str(a + b),
                reward=float(answer == str(a + b)),
                status="completed",
                loss_mask=[1] * k,
                # float32 values, as the engine's tensor.tolist() hands them over
                rollout_log_probs=np.float32([-rng.random() * 3 for _ in range(k)]).tolist(),
                weight_version=rollout_id,
                seed=rng.getrandbits(63),
                metadata={"finish_reason": "stop"},
            )
        )
    return samples


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    """Fastest wall time of ``repeats`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB"


def bench_one(n: int, long: int, repeats: int, workdir: Path) -> tuple[list[str], list[str]]:
    """One rollout size: (summary row, stage-breakdown row)."""
    samples = make_rollout(n, long)
    pq_path, pt_path = workdir / f"r{n}_{long}.parquet", workdir / f"r{n}_{long}.pt"
    write_rollout(pq_path, samples)
    save_slime_dump(pt_path, 3, samples)
    # Both formats must give back exactly what was written, or the timing compares nothing.
    assert read_rollout(pq_path) == samples and load_slime_dump(pt_path)[2] == samples

    t_pq = best_of(repeats, lambda: read_rollout(pq_path))
    t_pt = best_of(repeats, lambda: load_slime_dump(pt_path))
    pq_size, pt_size = pq_path.stat().st_size, pt_path.stat().st_size
    label = f"{n} x {'~4' if not long else long} tok"
    summary = [
        label,
        _ms(t_pq),
        _ms(t_pt),
        f"{t_pt / t_pq:.1f}x",
        _kib(pq_size),
        _kib(pt_size),
        f"{pt_size / pq_size:.1f}x",
    ]

    arrow = read_table(pq_path, verify=False)
    payload = torch.load(pt_path, weights_only=True)
    stages = [
        label,
        _ms(best_of(repeats, lambda: read_table(pq_path, verify=False))),
        _ms(best_of(repeats, lambda: table_content_sha256(arrow))),
        _ms(best_of(repeats, lambda: table_to_samples(arrow))),
        _ms(best_of(repeats, lambda: torch.load(pt_path, weights_only=True))),
        _ms(best_of(repeats, lambda: torch.load(pt_path, weights_only=False))),
        _ms(
            best_of(
                repeats, lambda: [_slime_to_sample(d, 3, None, i) for i, d in enumerate(payload["samples"])]
            )
        ),
    ]
    return summary, stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated sample counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed loads per case; the best counts")
    parser.add_argument("--long", type=int, default=256, help="response length of the long variant (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch / Arrow CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import pyarrow as pa

    pa.set_cpu_count(args.threads)  # Arrow decodes columns in parallel; pin it like torch for fairness

    cases = [(int(n), 0) for n in args.sizes.split(",")]
    if args.long:
        cases += [(int(n), args.long) for n in args.sizes.split(",")]
    summaries, stages = [], []
    with tempfile.TemporaryDirectory(prefix="rf-bench-formats-") as tmp:
        for n, long in cases:
            summary, stage = bench_one(n, long, args.repeats, Path(tmp))
            summaries.append(summary)
            stages.append(stage)
            print(f"done: {summary[0]}", file=sys.stderr, flush=True)

    print(f"load into list[Sample], best of {args.repeats} ({args.threads} thread(s)); sizes on disk")
    print(
        table(
            ["rollout", "parquet load", "pt load", "pt/parquet", "parquet size", "pt size", "pt/parquet"],
            summaries,
        )
    )
    print()
    print("where the load time goes")
    print(
        table(
            [
                "rollout",
                "pq read(verify=F)",
                "pq checksum",
                "pq ->Sample",
                "torch.load(wo=T)",
                "torch.load(wo=F)",
                "pt dict->Sample",
            ],
            stages,
        )
    )


if __name__ == "__main__":
    main()
