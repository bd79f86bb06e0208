"""Generation throughput: rollflow's embedded TorchEngine against HF `model.generate`, tokens/s.

Both load the same bootstrapped checkpoint of `--recipe` (tiny-arith, or long-arith for 64-256-token
responses; float32, CPU, `--threads` torch threads) and complete the same B chat-formatted prompts of that
recipe (B = each `--batch-sizes` entry; HF gets them left padded) by plain sampling: temperature 1.0, no
top-k/top-p, `--max-new-tokens K` (default 8 for tiny-arith, 256 for long-arith).
Token counting modes (`--mode`):
  eos   both stop a row at EOS; counted: response tokens actually produced, up to and including EOS
        (a batch ends when every row has stopped or reached K);
  full  EOS does not stop either (engine: no stop tokens; HF: eos_token_id=None): every row gets K.
Per batch size and mode: one untimed warm-up call each, then `--repeats` timed calls alternating
engine / HF; tokens/s = all counted tokens / all timed seconds.

    python bench/generate.py [--recipe tiny-arith|long-arith] [--batch-sizes 64,256] [--max-new-tokens K]
                             [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._flops import flops_per_token, matmul_peak_gflops  # noqa: E402
from bench._table import table  # noqa: E402
from engines.base import GenerateRequest, SamplingParams  # noqa: E402
from engines.torch_engine.engine import TorchEngine  # noqa: E402
from recipes.registry import RECIPES, get_recipe  # noqa: E402


def engine_call(
    engine: TorchEngine, prompts: list[list[int]], k: int, stop: tuple[int, ...], seed: int
) -> tuple[int, float]:
    """(tokens produced, seconds) for one engine.generate over all prompts."""
    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=k, stop_token_ids=stop)
    reqs = [GenerateRequest(tuple(p), seed * len(prompts) + i, params) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    outs = engine.generate(reqs)
    return sum(len(o.response_tokens) for o in outs), time.perf_counter() - start


def hf_call(
    model: torch.nn.Module, prompts: list[list[int]], k: int, eos: int, pad: int, full: bool, seed: int
) -> tuple[int, float]:
    """(tokens produced, seconds) for one left-padded model.generate over all prompts."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=k,
            pad_token_id=pad,
            eos_token_id=None if full else eos,
        )
    seconds = time.perf_counter() - start
    if full:
        return out[:, width:].numel(), seconds
    tokens = 0
    for row in out[:, width:].tolist():
        tokens += row.index(eos) + 1 if eos in row else len(row)
    return tokens, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="tiny-arith", help="the model and prompts")
    p.add_argument("--batch-sizes", default="64,256", help="comma-separated prompt batch sizes")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="K, the same for both (default: 8 for tiny-arith, 256 for long-arith)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed calls per side (after one warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both")
    p.add_argument("--mode", choices=["eos", "full", "both"], default="both", help="token counting mode")
    args = p.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    modes = ["eos", "full"] if args.mode == "both" else [args.mode]

    recipe = get_recipe(args.recipe)
    checkpoint = str(recipe.ensure_checkpoint())
    tok = AutoTokenizer.from_pretrained(checkpoint)
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id)
    engine = TorchEngine(checkpoint, num_threads=args.threads, max_batch_size=max(batch_sizes))
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    torch.set_num_threads(args.threads)
    pool = [row["prompt"] for row in pq.read_table(recipe.ensure_data()[0]).to_pylist()]
    # tiny-arith's answers take at most 4 tokens; a recipe with longer ones names its maximum (long-arith: 256)
    k = args.max_new_tokens or recipe.rollout.get("rollout_max_response_len", 8)

    peak = matmul_peak_gflops(args.threads)
    rows = []
    for b in batch_sizes:
        prompts = [
            tok.encode(
                tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )
            for m in pool[:b]
        ]
        for mode in modes:
            full = mode == "full"
            stop = () if full else (eos,)
            engine_call(engine, prompts, k, stop, seed=10_000)  # warm-up
            hf_call(model, prompts, k, eos, pad, full, seed=10_000)
            totals = {"engine": [0, 0.0], "hf": [0, 0.0]}
            for r in range(args.repeats):
                for side, (n, s) in (
                    ("engine", engine_call(engine, prompts, k, stop, seed=r)),
                    ("hf", hf_call(model, prompts, k, eos, pad, full, seed=r)),
                ):
                    totals[side][0] += n
                    totals[side][1] += s
            e_tps, h_tps = (totals[x][0] / totals[x][1] for x in ("engine", "hf"))
            per_row = [f"{totals[x][0] / (args.repeats * b):.2f}" for x in ("engine", "hf")]
            # FLOP limit: each token attends over its prompt and half of its row's answer on average
            context = sum(len(x) for x in prompts) / b + totals["engine"][0] / (args.repeats * b) / 2
            share = [tps * flops_per_token(model, context) / 1e9 / peak for tps in (e_tps, h_tps)]
            rows.append(
                [
                    str(b),
                    mode,
                    *per_row,
                    f"{e_tps:,.0f}",
                    f"{h_tps:,.0f}",
                    f"{e_tps / h_tps:.2f}x",
                    *(f"{x:.1%}" for x in share),
                ]
            )
            print(" ".join(rows[-1]), flush=True)

    print(
        f"\n{args.recipe}: K = {k} max new tokens, {args.repeats} timed repeats after 1 warm-up, {args.threads} torch "
        f"thread(s); eos = tokens up to and including EOS counted, full = EOS ignored, K tokens per row"
    )
    print(
        f"FLOP limit: fp32 GEMM at {peak:.0f} GFLOP/s on {args.threads} thread(s); "
        f"{flops_per_token(model, 0) / 1e6:.1f} MFLOP per token before attention"
    )
    print(
        table(
            [
                "batch",
                "mode",
                "tok/row engine",
                "tok/row HF",
                "rollflow engine tok/s",
                "HF generate tok/s",
                "engine / HF",
                "engine % of limit",
                "HF % of limit",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
