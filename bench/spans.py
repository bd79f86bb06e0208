"""Does the Prefect timeline tell the truth? A short real run, each stage's actor calls against its tasks.

Runs `flows.run.run_flow` on a throw-away Prefect home (ephemeral server) and a local Ray, then reads the
run's task runs back from Prefect and the actors' method calls from Ray's timeline (`flows.spans`), and prints
per stage: the calls attributed to it, how many of them ran outside every task run of their stages (by more
than --tolerance-ms; early: head starts, late: work that outlasted its task run) and the worst excess; then
the calls of the actors' start-up, recovery and shut-down, with how many ran inside a rollout's flow run
between its tasks. Exit status 1 when any call is outside (a violation).

    python bench/spans.py [--recipe tiny-arith|long-arith] [--rollouts 4] [--batch-size 8] [--n-samples 4]
                          [--eval-interval 2] [--tolerance-ms 5] [--dump spans.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_TMP = Path(tempfile.mkdtemp(prefix="rf-bench-spans-"))
# before anything imports prefect or ray
os.environ["PREFECT_HOME"] = str(_TMP / "prefect")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# the workers report their timeline events every this many ms; the run's last calls reach the timeline only if
# reported before the run kills its actors (Ray's default, a second, loses them)
os.environ.setdefault("RAY_task_events_report_interval_ms", "100")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.cli import configure_prefect_env, configure_ray_env  # noqa: E402

configure_prefect_env()  # the Prefect settings `rollflow run` uses
configure_ray_env()  # and its Ray settings (before ray is imported)

from config import RunConfig  # noqa: E402
from flows.spans import Call, RunSpans  # noqa: E402
from recipes.registry import RECIPES  # noqa: E402


def spans_config(args: argparse.Namespace, run_dir: Path) -> RunConfig:
    """A short run of `args.recipe` (its response lengths: up to 256 tokens for long-arith) with evals and
    checkpoints every --eval-interval rollouts (and after the last), one torch thread."""
    return RunConfig.model_validate(
        {
            "name": "bench-spans",
            "run_dir": str(run_dir),
            "num_threads": 1,
            "recipe": args.recipe,
            "rollout": {
                "num_rollout": args.rollouts,
                "rollout_batch_size": args.batch_size,
                "n_samples_per_prompt": args.n_samples,
            },
            "eval": {"eval_interval": args.eval_interval, "n_samples_per_eval_prompt": 1},
            "train": {"global_batch_size": args.batch_size * args.n_samples},
            "checkpoint": {"save": str(run_dir.parent / "save"), "save_interval": args.eval_interval},
        }
    )


def dump(path: Path, spans: RunSpans, calls: list[Call]) -> None:
    """`spans` and `calls` as JSON at `path`, every time in seconds from the parent flow run's start."""
    t0 = spans.parent.start

    def since(row: tuple[Any, ...]) -> list[Any]:
        return [round(x - t0, 6) if isinstance(x, float) else x for x in row]

    path.write_text(
        json.dumps(
            {
                "parent": since(spans.parent),
                "rollouts": [since(r) for r in spans.rollouts],
                "tasks": [since(t) for t in spans.tasks],
                "calls": [since(c) for c in calls],
            },
            indent=1,
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--recipe", choices=sorted(RECIPES), default="tiny-arith", help="the model, prompts and reward"
    )
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8, help="rollout_batch_size (prompts per rollout)")
    p.add_argument("--n-samples", type=int, default=4, help="n_samples_per_prompt")
    p.add_argument(
        "--eval-interval", type=int, default=2, help="eval every this many rollouts (and after the last)"
    )
    p.add_argument(
        "--tolerance-ms", type=float, default=5.0, help="slack for the two processes' clock readings"
    )
    p.add_argument(
        "--dump",
        type=Path,
        default=None,
        help="write the run's flow runs, task runs and actor calls as JSON (seconds from its start)",
    )
    args = p.parse_args()

    import asyncio

    import ray

    from flows.run import run_flow
    from flows.spans import attribute, read_run_spans, run_calls

    try:  # run_flow starts a local Ray as `rollflow run` does; the timeline is read before it stops
        state = asyncio.run(run_flow(spans_config(args, _TMP / "run"), return_state=True))
        if not state.is_completed():
            raise RuntimeError(f"run_flow ended {state.type}: {state.message}")
        spans = asyncio.run(read_run_spans(state.state_details.flow_run_id))
        calls = asyncio.run(run_calls(spans))
    finally:
        if ray.is_initialized():
            ray.shutdown()
    report = attribute(calls, spans, args.tolerance_ms)
    if args.dump:
        dump(args.dump, spans, calls)
    print(
        f"\n{args.recipe}: {args.rollouts} rollouts x {args.batch_size} prompts x {args.n_samples} samples, "
        f"eval every {args.eval_interval}; each actor call against the task runs of its stages"
    )
    print(report.table())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
