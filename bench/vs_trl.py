"""Seconds per RL step: rollflow against TRL's GRPOTrainer on the same tiny model and prompts.

One step = P prompts x G samples (the GRPO group), at most L new tokens, sampled at temperature 1.0,
then one optimizer step (AdamW, lr 1e-5, no KL / reference model on either side), on the model, prompts and
reward of `--recipe` (tiny-arith; long-arith for 64-256-token responses, where L defaults to 256, not 8).
  rollflow  `bench/_plain_loop.plain_rollouts` in this process: engine generate + write rollout +
            trainer log-probs + train step + weight update (no Prefect, no Ray); timed per rollout.
            Twice: as configured by default (the trainer recomputes old log-probs in a separate forward,
            which the --ci-test KL checker relies on) and with --use-rollout-logprobs (the engine's
            log-probs are the old policy's: no extra forward, like TRL, whose single step per
            generation uses the detached current log-probs).
            `--with-flow` also runs the real Prefect flow (bench/_flow_run.py's `flow_rollouts`).
  TRL       `GRPOTrainer` with per_device_train_batch_size = P*G, num_generations = G,
            max_completion_length = L, use_cpu, a `datasets.Dataset` of the same chat-formatted
            recipe's prompts (rollout i's prompts at step i, no shuffling) and a reward function
            wrapping the recipe's reward (rollout.rewards.builtin_reward); a TrainerCallback times on_step_begin ->
            on_step_end (generation, reward, loss and optimizer step all fall inside).
The TRL half always runs in a subprocess (`--side trl`), under this interpreter if it can import
`trl`, else under `--trl-python`. The sides take turns step by step (rollflow, rollflow
--use-rollout-logprobs, TRL, rollflow, ...): the child waits at each step's start until it is told to go, so
that a machine that slows down or speeds up during the run (these shared 2-core machines drift by 15-30%)
weighs on every side alike. Step 0 of each side is a warm-up and is left out of the means.

    python bench/vs_trl.py [--recipe tiny-arith|long-arith] [--prompts 8] [--generations 8] [--completion-len L]
                           [--steps 16] [--with-flow]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._plain_loop import plain_steps  # noqa: E402
from bench._table import mean, table  # noqa: E402
from config import RunConfig  # noqa: E402
from flows.resolve import resolve  # noqa: E402
from recipes.registry import RECIPES, get_recipe  # noqa: E402
from rollout.data import prompts_for_rollout  # noqa: E402

LR = 1e-5


def bench_config(args: argparse.Namespace, run_dir: Path, use_rollout_logprobs: bool = False) -> RunConfig:
    """The rollflow side: one rollout = one optimizer step over P x G samples; eval off.
    `use_rollout_logprobs`: the engine's log-probs are the old policy's (no trainer log-prob pass), which
    is TRL's work here: with one step per generation TRL uses the detached current log-probs."""
    return RunConfig.model_validate(
        {
            "name": "bench-vs-trl",
            "run_dir": str(run_dir),
            "num_threads": args.threads,
            "recipe": args.recipe,
            "rollout": {
                "num_rollout": args.steps,
                "rollout_batch_size": args.prompts,
                "n_samples_per_prompt": args.generations,
                "rollout_max_response_len": args.completion_len,
            },
            "eval": {"eval_interval": None},
            "train": {
                "lr": LR,
                "global_batch_size": args.prompts * args.generations,
                "use_rollout_logprobs": use_rollout_logprobs,
            },
        }
    )


def trl_steps(args: argparse.Namespace, out_dir: Path) -> None:
    """Train TRL's GRPOTrainer for `args.steps` steps in lockstep with the parent: "ready" on `--done-fd` once
    set up, then each step waits for a byte on `--go-fd` and reports its seconds (step_begin -> step_end) there."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollout.rewards import builtin_reward

    torch.set_num_threads(args.threads)
    cfg, src = resolve(bench_config(args, out_dir))  # the same prompts, in the same order, as rollflow's side
    assert src.train is not None and cfg.hf_checkpoint is not None and cfg.reward.rm_type is not None
    reward = builtin_reward(cfg.reward.rm_type)  # the recipe's
    checkpoint = cfg.hf_checkpoint
    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    r = cfg.rollout
    problems = [
        p
        for step in range(args.steps)
        for p in prompts_for_rollout(
            src.train.prompts, r.rollout_batch_size, step, r.rollout_seed, cfg.data.rollout_shuffle
        )
    ]
    dataset = Dataset.from_list([{"prompt": p.text, "label": p.label} for p in problems])

    def arith_reward(completions: list[str], label: list[str], **_: object) -> list[float]:
        return [reward(c, y) for c, y in zip(completions, label, strict=True)]

    go, done = os.fdopen(args.go_fd, "rb", buffering=0), os.fdopen(args.done_fd, "w")

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_: object, **__: object) -> None:
            print("ready", file=done, flush=True)

        def on_step_begin(self, *_: object, **__: object) -> None:
            if not go.read(1):
                raise SystemExit("vs_trl: the parent benchmark went away")
            self.start = time.perf_counter()

        def on_step_end(self, *_: object, **__: object) -> None:
            print(time.perf_counter() - self.start, file=done, flush=True)

    config = GRPOConfig(
        output_dir=str(out_dir / "trl"),
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.completion_len,
        use_cpu=True,
        report_to=[],
        logging_steps=args.steps,
        max_steps=args.steps,
        learning_rate=LR,
        bf16=args.precision == "bf16",  # CPU autocast over float32 master weights, as rollflow's bf16 trainer
        save_strategy="no",
        disable_tqdm=True,
        shuffle_dataset=False,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
        seed=1234,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arith_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[StepTimer()],
    )
    trainer.train()


class TrlInLockstep:
    """TRL's GRPOTrainer (`--side trl`) in a child process that runs one step per `step()`; `args.precision`
    (bf16 | fp32, fp32 when absent: bench/scaling.py sets it) picks TRL's `bf16` setting."""

    def __init__(self, args: argparse.Namespace) -> None:
        python = sys.executable if importlib.util.find_spec("trl") else args.trl_python
        if python is None:
            raise SystemExit(
                "trl is not installed here: `ROLLFLOW_EXTRAS=dev,bench scripts/setup` installs the bench "
                "extra into .venv, or pass --trl-python PATH to an interpreter that has it"
            )
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        cmd = [python, str(Path(__file__).resolve()), "--side", "trl", "--go-fd", str(go_r)]
        cmd += ["--done-fd", str(done_w), "--recipe", args.recipe, "--prompts", str(args.prompts)]
        cmd += ["--generations", str(args.generations), "--completion-len", str(args.completion_len)]
        cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
        cmd += ["--precision", getattr(args, "precision", "fp32")]
        print("TRL side:", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, pass_fds=(go_r, done_w))
        os.close(go_r)
        os.close(done_w)
        self.go, self.done = os.fdopen(go_w, "wb", buffering=0), os.fdopen(done_r)
        self.steps = 0
        if self.done.readline().strip() != "ready":
            self.close()
            raise SystemExit("vs_trl: the TRL side ended before its first step")

    def step(self) -> float:
        """Let the child run its next step; that step's seconds."""
        self.go.write(b"g")
        line = self.done.readline()
        if not line:
            self.close()
            raise SystemExit(f"vs_trl: the TRL side ended before step {self.steps}")
        self.steps += 1
        return float(line)

    def close(self) -> None:
        """Wait for the child (it ends after its last step); raise SystemExit if it failed."""
        self.go.close()
        rc = self.proc.wait()
        self.done.close()
        if rc:
            raise SystemExit(f"vs_trl: the TRL side exited with status {rc}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--recipe", choices=sorted(RECIPES), default="tiny-arith", help="the model, prompts and reward"
    )
    p.add_argument("--prompts", type=int, default=8, help="P, prompts per step")
    p.add_argument("--generations", type=int, default=8, help="G, samples per prompt (GRPO group size)")
    p.add_argument(
        "--completion-len",
        type=int,
        default=None,
        help="L, max new tokens (default: 8 for tiny-arith, 256 for long-arith)",
    )
    p.add_argument("--steps", type=int, default=16, help="steps per side (step 0 is the warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    p.add_argument("--with-flow", action="store_true", help="also time the real Prefect flow per rollout")
    p.add_argument(
        "--trl-python", default=None, help="interpreter for the TRL half when this one cannot import trl"
    )
    p.add_argument("--precision", choices=["bf16", "fp32"], default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--side", choices=["both", "trl"], default="both", help=argparse.SUPPRESS)
    p.add_argument("--go-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--done-fd", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    # tiny-arith's answers take at most 4 tokens; a recipe with longer ones names its maximum (long-arith: 256)
    args.completion_len = args.completion_len or get_recipe(args.recipe).rollout.get(
        "rollout_max_response_len", 8
    )
    if args.steps < 2:
        p.error("--steps must be >= 2 (step 0 is excluded as warm-up)")
    tmp = Path(tempfile.mkdtemp(prefix="rf-bench-vs-trl-"))

    if args.side == "trl":
        trl_steps(args, tmp)
        return

    trl = TrlInLockstep(args)
    sides = {
        "rollflow plain loop": plain_steps(bench_config(args, tmp / "plain"), args.steps),
        "rollflow plain loop, --use-rollout-logprobs": plain_steps(
            bench_config(args, tmp / "plain-rollout-lp", use_rollout_logprobs=True), args.steps
        ),
    }
    seconds: dict[str, list[float]] = {name: [] for name in ["TRL GRPOTrainer", *sides]}
    for _ in range(args.steps):  # one step of each side in turn
        for name, steps in sides.items():
            seconds[name].append(next(steps))
        seconds["TRL GRPOTrainer"].append(trl.step())
    trl.close()
    for steps in sides.values():
        steps.close()
    for name, xs in seconds.items():
        print(f"{name} s/step:", " ".join(f"{x:.3f}" for x in xs), flush=True)
    base = mean(seconds["TRL GRPOTrainer"][1:])
    rows = [[name, f"{mean(xs[1:]):.3f}", f"{base / mean(xs[1:]):.2f}x"] for name, xs in seconds.items()]
    if args.with_flow:
        from bench._flow_run import flow_rollouts  # sets Prefect/Ray env vars on import

        flow, cadence, *_ = flow_rollouts(bench_config(args, tmp / "flow"))
        rows.append(
            ["rollflow flow (rollout-* run)", f"{mean(flow[1:]):.3f}", f"{base / mean(flow[1:]):.2f}x"]
        )
        rows.append(
            ["rollflow flow (cadence)", f"{mean(cadence[1:]):.3f}", f"{base / mean(cadence[1:]):.2f}x"]
        )

    print(
        f"\n{args.recipe}: {args.prompts} prompts x {args.generations} generations, completion <= {args.completion_len} "
        f"tokens, {args.steps} steps (mean over steps 1..{args.steps - 1}), {args.threads} torch thread(s)"
    )
    print(table(["side", "s/step", "TRL s / this s (>1: faster than TRL)"], rows))


if __name__ == "__main__":
    main()
