"""The long-arith workload: build (or load) the recipe's model and describe what it generates.

Prints the parameter count, the warm-up's build seconds (when this call built it), and, for `--samples` eval
prompts sampled once each by rollflow's embedded TorchEngine at temperature 1.0 (no top-k/top-p, at most
`--max-new-tokens`, stopped at EOS), the response-length distribution (min/p10/median/p90/max tokens, EOS
included, and the fraction cut at the maximum), the mean reward (recipes.long_arith.reward: 1 for the exact sum,
else partial credit for the steps' fields), the exact-sum fraction and the engine's generation seconds.

    python bench/long_arith.py [--samples 128] [--max-new-tokens 256] [--threads 1] [--cache-dir D]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.base import GenerateRequest, SamplingParams  # noqa: E402
from engines.torch_engine.engine import TorchEngine  # noqa: E402
from recipes.long_arith.bootstrap import ensure_checkpoint  # noqa: E402
from recipes.long_arith.data import eval_problems, make_problems  # noqa: E402
from recipes.long_arith.reward import reward  # noqa: E402
from recipes.long_arith.settings import checkpoint_path  # noqa: E402


def percentile(values: list[int], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=128, help="eval prompts, one sample each")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine (and of a build)")
    p.add_argument(
        "--cache-dir", default=None, help="model cache (default: $ROLLFLOW_CACHE_DIR or ~/.cache/rollflow)"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    built = not (checkpoint_path(args.cache_dir) / "DONE").exists()
    start = time.perf_counter()
    checkpoint = ensure_checkpoint(args.cache_dir, num_threads=args.threads)
    build_seconds = time.perf_counter() - start
    info = json.loads((checkpoint / "bootstrap_info.json").read_text())

    engine = TorchEngine(str(checkpoint), num_threads=args.threads, max_batch_size=args.samples)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    pool = eval_problems()
    problems = (pool + make_problems(max(0, args.samples - len(pool)), seed=1, split="eval"))[: args.samples]
    params = SamplingParams(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=args.max_new_tokens,
        stop_token_ids=(int(tok.eos_token_id),),
    )
    requests = [
        GenerateRequest(
            tuple(
                tok.encode(
                    tok.apply_chat_template(
                        [{"role": "user", "content": q["question"]}],
                        tokenize=False,
                        add_generation_prompt=True,
                    ),
                    add_special_tokens=False,
                )
            ),
            args.seed * len(problems) + i,
            params,
        )
        for i, q in enumerate(problems)
    ]
    start = time.perf_counter()
    outs = engine.generate(requests)
    gen_seconds = time.perf_counter() - start

    lengths = [len(o.response_tokens) for o in outs]
    rewards = [
        reward(tok.decode(list(o.response_tokens)), q["label"]) for o, q in zip(outs, problems, strict=True)
    ]
    cut = sum(o.finish_reason == "length" for o in outs) / len(outs)
    print(f"checkpoint        {checkpoint}")
    print(f"parameters        {info['num_parameters']:,} (vocabulary {engine.model.config.vocab_size})")
    print(
        f"build seconds     {build_seconds:.1f} (this call)"
        if built
        else f"build seconds     {info['seconds']} (recorded when it was built, {info['num_threads']} thread(s))"
    )
    print(
        f"response tokens   min {min(lengths)}  p10 {percentile(lengths, 0.1)}  median "
        f"{statistics.median(lengths):g}  p90 {percentile(lengths, 0.9)}  max {max(lengths)}  "
        f"cut at {args.max_new_tokens}: {cut:.3f}  (n={len(lengths)}, T=1.0, mean {statistics.mean(lengths):.1f})"
    )
    print(
        f"reward            mean {statistics.mean(rewards):.3f}  exact sum {sum(r == 1.0 for r in rewards) / len(rewards):.3f}"
    )
    print(
        f"engine generate   {gen_seconds:.1f}s for {sum(lengths):,} tokens ({sum(lengths) / gen_seconds:,.0f} tok/s, "
        f"{args.threads} thread(s))"
    )


if __name__ == "__main__":
    main()
