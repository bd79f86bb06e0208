"""Orchestration seconds per rollout: the Prefect flow over Ray actors against a plain in-process loop.

(b) plain: `bench/_plain_loop.plain_rollouts` -- TorchEngine + TorchTrainer in this process, no Prefect,
    no Ray -- timed around each rollout.
(a) flow: `flows.run.run_flow` on a throw-away Prefect home (ephemeral server) and a local Ray; the
    per-rollout times are read back from Prefect: each `rollout-<id>` child flow run's start -> end
    ("flow run") and the start -> start interval to the next child ("start to start", which also counts the
    parent's between-rollout work: creating the next child run; that part alone is the "gap": one child's
    end -> the next child's start).
Same config for both (no checkpoints, 1 torch thread): by default a small one with eval off; with
--default-recipe the default recipe's (RunConfig's defaults: 128 prompts x 4 samples, eval every 10 rollouts,
which the plain loop then runs too) with --rollouts rollouts. --recipe picks the model, prompts and reward for
either: tiny-arith (the default; responses of at most 6 tokens unless --max-response-len) or long-arith (its
preset's responses of 64-256 tokens, at most 256 unless --max-response-len). Rollout 0 is a warm-up and is left
out of every mean. The plain loop runs before the flow (the Prefect server and Ray not yet running) and again
after it (Ray stopped, the server idle): the machine's speed drifts by 15-30 % within minutes, and the flow is
compared with the plain loop on both sides of it (their rollouts pooled for the medians and means; the mean of
the two for the total), not with whichever side ran in a faster minute. The difference flow - plain is the
orchestration overhead per rollout (Prefect task/flow runs, Ray calls and object transfer, the flow's extra checks,
metric logging and artifacts).

The two figures of issue 09's "done when", printed last:
- start to start minus in-process, per rollout (medians; means beside them), target <= 0.1 s on a quiet machine;
- the flow's rollouts / the plain loop's: the flow's first child start -> last child end over the sum of the
  plain loop's rollouts (the mean of its two passes), all rollouts counted (Prefect/Ray start-up, before the
  first child, is not), target <= 1.3x with --default-recipe --rollouts 40.

With --timeline it also prints where a rollout's time goes on each side: the in-process loop's phases, each
child flow run's task runs (when each starts and ends, from the child's start, as Prefect recorded them), and the
engine's and trainer's own timers (the `perf/*` metrics) on both sides; medians over the rollouts that ran no
eval, the warm-up left out.

    python bench/overhead.py [--rollouts 6] [--batch-size 16] [--n-samples 8] [--max-response-len 6]
    python bench/overhead.py --default-recipe --rollouts 40 [--timeline]
    python bench/overhead.py --recipe long-arith --rollouts 6 [--timeline]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._flow_run import TMP as _TMP  # noqa: E402  (sets Prefect's and Ray's env first)
from bench._flow_run import Timeline, flow_perf, flow_rollouts  # noqa: E402
from bench._plain_loop import PHASES, plain_rollouts  # noqa: E402
from bench._table import mean, table  # noqa: E402
from config import RunConfig  # noqa: E402
from procs import threads  # noqa: E402
from recipes.registry import RECIPES  # noqa: E402


def default_recipe_config(
    run_dir: Path, rollouts: int, name: str = "bench-overhead", recipe: str = "tiny-arith"
) -> RunConfig:
    """The default recipe's config (every RunConfig default) with `rollouts` rollouts, on `recipe`'s model, data
    and reward (and its preset response length)."""
    return RunConfig.model_validate(
        {"name": name, "run_dir": str(run_dir), "recipe": recipe, "rollout": {"num_rollout": rollouts}}
    )


def bench_config(
    run_dir: Path,
    rollouts: int,
    batch_size: int,
    n_samples: int,
    max_len: int | None,
    name: str = "bench-overhead",
    recipe: str = "tiny-arith",
) -> RunConfig:
    """A small but real run of `recipe`: eval off, no checkpoints, one optimizer step per rollout; responses of at
    most `max_len` tokens (None: the recipe's preset, else RunConfig's default)."""
    lengths = {} if max_len is None else {"rollout_max_response_len": max_len}
    return RunConfig.model_validate(
        {
            "name": name,
            "run_dir": str(run_dir),
            "num_threads": 1,
            "recipe": recipe,
            "rollout": {
                "num_rollout": rollouts,
                "rollout_batch_size": batch_size,
                "n_samples_per_prompt": n_samples,
                **lengths,
            },
            "eval": {"eval_interval": None},
            "train": {"global_batch_size": batch_size * n_samples},
        }
    )


def print_timeline(plain: dict[str, list[float]], timeline: Timeline, perf: dict[str, list[float]]) -> None:
    """The --timeline tables (ms, medians): `plain` the in-process phases and trainer timers, `timeline` the
    flow's task runs (`flow_rollouts`), `perf` the flow's perf metrics (`flow_perf`)."""

    def ms(xs: list[float]) -> str:
        return f"{1000 * statistics.median(xs):.1f}" if xs else "-"

    print(
        "\nWhere a rollout's time goes (--timeline): ms, medians over the rollouts that ran no eval, warm-up left out"
    )
    print("in process, one call after the other:")
    print(table(["phase", "ms"], [[name, ms(plain.get(name, []))] for name in PHASES]))
    print("\nthe flow's task runs, from their child flow run's start (as Prefect recorded them):")
    rows = [
        [name, ms([s for s, _ in runs]), ms([e for _, e in runs]), ms([e - s for s, e in runs])]
        for name, runs in sorted(
            timeline.tasks.items(), key=lambda item: statistics.median(s for s, _ in item[1])
        )
    ]
    print(table(["task", "starts", "ends", "takes"], rows))
    print(
        "\nthe engines' and the trainer's own timers (in process, perf/rollout_time is the generate phase):"
    )
    plain = {**plain, "perf/rollout_time": plain.get("generate", [])}
    names = sorted(
        n for n in {*perf, *plain} if n.startswith("perf/") and n.endswith("_time") and n != "perf/step_time"
    )
    print(
        table(
            ["timer", "in process", "in the flow"],
            [[n, ms(plain.get(n, [])), ms(perf.get(n, []))] for n in names],
        )
    )


# The in-process passes before and after the flow do the same work: when their wall times differ by more than
# this, the machine's speed changed during the run (these shared 2-core machines drift by 15-30 % within minutes).
QUIET_DRIFT = 0.10


def _priority_back(niceness: int) -> None:
    """The flow lowered this process's CPU priority once its actors were up (flows.runtime.yield_to_actors): the
    in-process pass after it runs at the priority the pass before it had (`niceness`), where the OS lets this
    process raise it again (root, or CAP_SYS_NICE); otherwise it says so."""
    for tid in threads(os.getpid()):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except PermissionError:
            print(
                f"note: the in-process pass after the flow runs at nice {os.getpriority(os.PRIO_PROCESS, 0)}, "
                f"the one before it at {niceness} (raising the priority again is not permitted here)",
                flush=True,
            )
            return


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=6, help="rollouts per side (rollout 0 is the warm-up)")
    p.add_argument("--batch-size", type=int, default=16, help="rollout_batch_size (prompts per rollout)")
    p.add_argument("--n-samples", type=int, default=8, help="n_samples_per_prompt")
    p.add_argument(
        "--max-response-len",
        type=int,
        default=None,
        help="rollout_max_response_len (default: the recipe's, 256 for long-arith; 6 for tiny-arith)",
    )
    p.add_argument(
        "--default-recipe",
        action="store_true",
        help="the default recipe's config (RunConfig's defaults, eval included) with --rollouts rollouts; "
        "--batch-size, --n-samples and --max-response-len are ignored",
    )
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="tiny-arith",
        help="the model, prompts and reward: tiny-arith, or long-arith for responses of 64-256 tokens",
    )
    p.add_argument(
        "--timeline",
        action="store_true",
        help="also print where a rollout's time goes: the in-process phases, the flow's task runs, the actors' timers",
    )
    p.add_argument(
        "--orchestrator-niceness",
        type=int,
        default=None,
        help="the flow's --orchestrator-niceness (default: the run config's); 0 leaves the orchestrator as it is",
    )
    args = p.parse_args()
    if args.rollouts < 3:
        p.error("--rollouts must be >= 3 (rollout 0 is excluded as warm-up)")

    def config(run_dir: Path) -> RunConfig:
        if args.default_recipe:
            cfg = default_recipe_config(run_dir, args.rollouts, recipe=args.recipe)
        else:
            cfg = bench_config(
                run_dir,
                args.rollouts,
                args.batch_size,
                args.n_samples,
                args.max_response_len,
                recipe=args.recipe,
            )
        if args.orchestrator_niceness is None:
            return cfg
        placement = cfg.placement.model_copy(update={"orchestrator_niceness": args.orchestrator_niceness})
        return cfg.model_copy(update={"placement": placement})

    phases: tuple[dict[str, list[float]], dict[str, list[float]]] = ({}, {})  # each pass's
    timeline = Timeline() if args.timeline else None
    before = plain_rollouts(config(_TMP / "plain"), args.rollouts, phases[0])
    print("plain per-rollout s (before):", " ".join(f"{s:.3f}" for s in before), flush=True)
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    durations, cadence, gaps, span, wall = flow_rollouts(config(_TMP / "flow"), timeline)
    print("flow  per-rollout s:         ", " ".join(f"{s:.3f}" for s in durations), flush=True)
    print("flow  cadence s:             ", " ".join(f"{s:.3f}" for s in cadence), flush=True)
    _priority_back(niceness)
    after = plain_rollouts(config(_TMP / "plain-after"), args.rollouts, phases[1])
    print("plain per-rollout s (after): ", " ".join(f"{s:.3f}" for s in after), flush=True)

    plain = before[1:] + after[1:]  # both passes' rollouts, warm-ups left out
    base, base_median = mean(plain), statistics.median(plain)
    rows = [
        [f"plain loop, {label} the flow", f"{mean(xs[1:]):.3f}", "-", f"{statistics.median(xs[1:]):.3f}", "-"]
        for label, xs in (("before", before), ("after", after))
    ]
    rows.append(["plain loop (no Prefect, no Ray), both", f"{base:.3f}", "-", f"{base_median:.3f}", "-"])
    for label, xs in (
        ("flow: rollout-* flow run", durations[1:]),
        ("flow: start-to-start cadence", cadence[1:]),
    ):
        med = statistics.median(xs)
        rows.append(
            [label, f"{mean(xs):.3f}", f"{mean(xs) - base:+.3f}", f"{med:.3f}", f"{med - base_median:+.3f}"]
        )
    rows.append(
        [
            "flow: gap between child runs",
            f"{mean(gaps[1:]):.3f}",
            "(part of cadence)",
            f"{statistics.median(gaps[1:]):.3f}",
            "",
        ]
    )
    from flows.resolve import apply_recipe

    cfg = apply_recipe(config(_TMP / "x"), build=False)  # with the recipe's preset lengths
    r = cfg.rollout
    shape = (
        f"{r.rollout_batch_size} prompts x {r.n_samples_per_prompt} samples, max {r.rollout_max_response_len} "
        f"new tokens, eval {'every ' + str(cfg.eval.eval_interval) if cfg.eval.eval_interval else 'off'}"
    )
    print(
        f"\n{args.rollouts} rollouts x {shape}, {args.recipe}{' (default config)' if args.default_recipe else ''}, "
        f"1 torch thread; means over rollouts 1..{args.rollouts - 1} (cadence: 1..{args.rollouts - 2}); run_flow wall incl. "
        f"start-up {wall:.1f} s"
    )
    print(table(["per rollout", "mean s", "overhead s (vs plain)", "median s", "overhead (medians)"], rows))
    print(
        "A cadence far above the median is Prefect's SQLite answering 503 (database is locked) to a request of "
        "the loop more than three times in a row (the first three retries wait 0.05, 0.25 and 1 s, then Prefect's 16 s: "
        "flows/prefect_private.py::retry_busy_server_quickly), or the machine was busy."
    )
    s2s_median = statistics.median(cadence[1:]) - base_median
    s2s_mean = mean(cadence[1:]) - base
    plain_total = (sum(before) + sum(after)) / 2
    ratio = span / plain_total
    print(
        f"\ndone-when 1: start-to-start minus in-process per rollout: {s2s_median:+.3f} s (medians; means "
        f"{s2s_mean:+.3f} s); target <= 0.1 s on a quiet machine"
    )
    print(
        f"done-when 2: flow rollouts / in-process loop: {span:.1f} s / {plain_total:.1f} s = {ratio:.2f}x "
        f"(all {args.rollouts} rollouts; first child start -> last child end; in-process: the mean of the passes "
        f"before and after, {sum(before):.1f} and {sum(after):.1f} s); target <= 1.3x for "
        f"--default-recipe --rollouts 40"
    )
    drift = abs(sum(before) - sum(after)) / min(sum(before), sum(after))
    print(
        f"machine drift: the in-process passes differ by {100 * drift:.1f} % for the same work"
        + (
            f" (over {100 * QUIET_DRIFT:.0f} %: the machine's speed moved during this run, so the two figures above "
            "do not describe a quiet machine; compare alternated runs)"
            if drift > QUIET_DRIFT
            else ""
        )
    )
    if timeline is not None:  # each pass's warm-up left out
        pooled = {name: xs[1:] + phases[1].get(name, [])[1:] for name, xs in phases[0].items()}
        print_timeline(
            pooled, timeline, flow_perf(config(_TMP / "flow").resolved_run_dir, timeline.evaluating)
        )


if __name__ == "__main__":
    main()
