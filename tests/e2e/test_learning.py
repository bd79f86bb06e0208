"""The default recipe learns, on a short run, by a margin the run's own eval noise sets.

No accuracy level appears here: the warm-up model (and so the curve) can differ between machines, so
the bar is "the eval rose by more than four standard errors", each standard error computed from that
eval's own per-problem results.
"""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from artifacts.store import RunPaths, read_rollout
from config import RunConfig

pytestmark = pytest.mark.e2e


def accuracy_and_se(path) -> tuple[float, float]:
    """Mean reward of an eval rollout and its standard error over problems (samples of one problem are
    correlated, so the problem is the unit)."""
    per_problem: dict[int, list[float]] = {}
    for s in read_rollout(path):
        per_problem.setdefault(s.group_index, []).append(s.reward)
    means = [sum(v) / len(v) for v in per_problem.values()]
    return statistics.fmean(means), statistics.pstdev(means) / math.sqrt(len(means))


def test_default_recipe_learns_on_a_short_run(tmp_path, ray_session, prefect_server, base_checkpoint):
    from flows.run import run_flow

    rollouts = 12
    cfg = RunConfig.model_validate(
        {
            "name": "learn",
            "run_dir": str(tmp_path / "run"),
            "hf_checkpoint": base_checkpoint,
            "rollout": {"num_rollout": rollouts},
            "eval": {"eval_interval": rollouts},
        }
    )
    asyncio.run(run_flow(cfg))
    paths = RunPaths(cfg.resolved_run_dir)
    (first, se_first), (last, se_last) = (
        accuracy_and_se(paths.eval_rollout(0)),
        accuracy_and_se(paths.eval_rollout(rollouts)),
    )
    margin = 4 * math.hypot(se_first, se_last)
    assert last - first > margin, (
        f"eval {first:.3f} -> {last:.3f}: gain below 4 standard errors ({margin:.3f})"
    )
