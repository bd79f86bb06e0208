"""fp32 against bf16 (--precision) on one recipe: engine tokens/s, the log-prob pass, the train step, and how far
the trainer's log-probs are from the engine's at each precision (what the --ci-test log-prob bounds of
config/precision.py are a contract over).

Both sides run the rollflow loop in this process (bench/_plain_loop.py: one TorchEngine, one TorchTrainer, no Ray or
Prefect), the same prompts, seeds and steps; step 0 is a warm-up and is left out of the times. One optimizer step
per rollout, so the trainer fuses the step's forward and backward into the log-prob pass: `log-prob s` is the
trainer's forward and backward, `train s` the optimizer step that follows. The gaps are over
every rollout, warm-up included: `|mean gap|` is the checker's quantity (|rollout/log_probs -
rollout/rollout_log_probs|: the means over a rollout's response tokens), `token |gap|` the mean per-token absolute
difference (slime's train_rollout_logprob_abs_diff) and `max token gap` its largest.

    python bench/precision.py --recipe long-arith [--prompts 8] [--group 4] [--max-new-tokens 256] [--steps 3]
    flock /tmp/rollflow-big.lock python bench/precision.py --recipe long-arith-50m --prompts 4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from artifacts.store import RunPaths, read_rollout, read_table  # noqa: E402
from bench._plain_loop import plain_rollouts  # noqa: E402
from bench._table import mean, table  # noqa: E402
from config import RunConfig  # noqa: E402
from config.precision import read_cpu_flags, resolve_precision  # noqa: E402


def gaps(run_dir: Path, rollouts: int) -> tuple[float, float, float]:
    """(largest |mean gap| of a rollout, mean per-token |gap|, largest per-token |gap|) between the trainer's
    log-probs and the engine's over `rollouts` rollouts."""
    paths = RunPaths(run_dir)
    worst_mean, token_sum, token_count, token_max = 0.0, 0.0, 0, 0.0
    for rid in range(rollouts):
        trainer = {r["sample_index"]: r["log_probs"] for r in read_table(paths.logprobs(rid)).to_pylist()}
        engine_lp, trainer_lp = [], []
        for s in read_rollout(paths.rollout(rid)):
            engine_lp += list(s.rollout_log_probs)
            trainer_lp += list(trainer[s.sample_index][: len(s.rollout_log_probs)])
        diffs = [abs(a - b) for a, b in zip(trainer_lp, engine_lp, strict=True)]
        worst_mean = max(worst_mean, abs(mean(trainer_lp) - mean(engine_lp)))
        token_sum, token_count = token_sum + sum(diffs), token_count + len(diffs)
        token_max = max(token_max, max(diffs, default=0.0))
    return worst_mean, token_sum / max(token_count, 1), token_max


def measure(args: argparse.Namespace, precision: str, root: Path) -> dict[str, float]:
    run_dir = root / precision
    cfg = RunConfig.model_validate(
        {
            "recipe": args.recipe,
            "run_dir": str(run_dir),
            "num_threads": args.threads,
            "rollout": {
                "rollout_batch_size": args.prompts,
                "n_samples_per_prompt": args.group,
                "rollout_max_response_len": args.max_new_tokens,
            },
            "eval": {"eval_interval": None},
            "train": {
                "precision": precision,
                "global_batch_size": args.prompts * args.group,
                "num_steps_per_rollout": None,
            },
        }
    )
    phases: dict[str, list[float]] = {}
    plain_rollouts(cfg, args.steps, phases)
    tokens = [
        sum(s.response_length for s in read_rollout(RunPaths(run_dir).rollout(rid)))
        for rid in range(args.steps)
    ]
    timed = slice(1, None)  # step 0 warms up
    worst_mean, token_mean, token_max = gaps(run_dir, args.steps)
    return {
        "tok/s": sum(tokens[timed]) / sum(phases["generate"][timed]),
        "generate": mean(phases["generate"][timed]),
        "log-prob": mean(phases["log-prob pass"][timed]),
        "train": mean(phases["train step"][timed]),
        "sync": mean(phases["weight sync"][timed]),
        "tokens": mean([float(t) for t in tokens[timed]]),
        "mean gap": worst_mean,
        "token gap": token_mean,
        "max gap": token_max,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--recipe", default="long-arith", help="tiny-arith, long-arith, long-arith-50m, long-arith-0.5b"
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="rollouts per precision; step 0 is the warm-up")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be at least 2 (step 0 is the warm-up)")
    flags = read_cpu_flags()
    _, why = resolve_precision("auto", flags)
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="rollflow-precision-") as tmp:
        for precision in ("fp32", "bf16"):
            results[precision] = measure(args, precision, Path(tmp))
    for precision, r in results.items():
        rows.append(
            [
                precision,
                f"{r['tok/s']:.0f}",
                f"{r['generate']:.2f}",
                f"{r['log-prob']:.2f}",
                f"{r['train']:.2f}",
                f"{r['sync']:.3f}",
                f"{r['tokens']:.0f}",
                f"{r['mean gap']:.2e}",
                f"{r['token gap']:.2e}",
                f"{r['max gap']:.2e}",
            ]
        )
    print(
        f"{args.recipe}: {args.prompts} prompts x {args.group} samples, up to {args.max_new_tokens} new tokens, "
        f"{args.steps - 1} timed steps, {args.threads} thread(s); auto here: {why}"
    )
    print(
        table(
            [
                "precision",
                "engine tok/s",
                "generate s",
                "log-prob s",
                "train s",
                "sync s",
                "tokens/step",
                "|mean gap|",
                "token |gap|",
                "max token gap",
            ],
            rows,
        )
    )
    f32, b16 = results["fp32"], results["bf16"]
    print(
        f"bf16 / fp32: engine tok/s x{b16['tok/s'] / f32['tok/s']:.2f}, log-prob pass x{f32['log-prob'] / b16['log-prob']:.2f} "
        f"faster, train step x{f32['train'] / b16['train']:.2f} faster"
    )


if __name__ == "__main__":
    main()
