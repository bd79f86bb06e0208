"""`rollflow run --dry-run`'s plug-in checks. Each of slime's plug-ins that needs no engine is called on probe
samples of the run's own data (rollout/reward_check.py: the first row answered by its label, scored by the
run's reward). It is called through the function the run calls it with. So a plug-in that raises or returns
the wrong type is named in one line before anything starts:

- --dynamic-sampling-filter-path: `rollout.dynamic.judge` on one group of --n-samples-per-prompt samples;
- --buffer-filter-path: `rollout.plugins.DataSource.get_samples` with a buffer of two such groups, one asked for.

The loss plug-in is checked by trainers/custom_loss.check_loss. A --custom-generate-function-path or
--rollout-function-path generates through the inference engines, which a dry run does not start: the check says
so (their paths and signatures were checked when the run resolved)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from rollout.dynamic import FilterOutputError, judge, load_filter
from rollout.extensions import load_function
from rollout.plugins import DataSource, PluginError, rollout_function_path
from rollout.reward_check import run_probe, scored_group
from rollout.sample import Sample
from rollout.slime_args import slime_args

if TYPE_CHECKING:
    from config import RunConfig
    from rollout.source import RolloutSource

BUFFERED = 2  # groups in the probe buffer; the buffer filter is asked for one fewer


def check_run_plugins(cfg: RunConfig, source: RolloutSource) -> list[str]:
    """One line per plug-in the run sets: what it was called with and what it gave, or why it was not called;
    ValueError naming the plug-in, its probe and what was wrong."""
    lines = []
    for flag, path in (
        ("--custom-generate-function-path", cfg.rollout.custom_generate_function_path),
        ("--rollout-function-path", rollout_function_path(cfg)),
    ):
        if path:
            lines.append(
                f"plug-in check: {flag} {path} not called: it generates through the inference engines, which a "
                "dry run does not start (its path and signature are checked)"
            )
    s = cfg.sampling
    if not (s.dynamic_sampling_filter_path or s.buffer_filter_path):
        return lines
    probe = run_probe(cfg, source)
    if probe is None or source.train is None:
        return [*lines, "plug-in check: no training data to call the sampling plug-ins on"]
    group, where = scored_group(probe, cfg.rollout.n_samples_per_prompt)
    args = slime_args(cfg)
    if (
        s.dynamic_sampling_filter_path and cfg.rollout.rollout_function_path is None
    ):  # else the run never calls it
        lines.append(check_filter(s.dynamic_sampling_filter_path, args, group, where))
    if s.buffer_filter_path:
        lines.append(check_buffer_filter(s.buffer_filter_path, args, group, where))
    return lines


def check_filter(path: str, args: Any, group: list[Sample], where: str) -> str:
    """The dynamic sampling filter `path` judging `group` as the run judges a group (`rollout.dynamic.judge`)."""
    called = f"--dynamic-sampling-filter-path {path} called as filter(args, samples) on {where}"
    try:
        out = judge(load_filter(path), args, copy.deepcopy(group), path)
    except FilterOutputError as e:
        raise ValueError(
            f"{called}: {str(e).removeprefix(f'--dynamic-sampling-filter-path {path} ')}"
        ) from None
    except Exception as e:
        raise ValueError(f"{called}: raised {type(e).__name__}: {e}") from None
    verdict = f"keep {out.keep}" + (f" (reason {out.reason!r})" if out.reason else "")
    return f"plug-in check: --dynamic-sampling-filter-path {path} on {where}: {verdict}"


def check_buffer_filter(path: str, args: Any, group: list[Sample], where: str) -> str:
    """The buffer filter `path` called as a rollout function's data source calls it (`DataSource.get_samples`
    serving its buffer first): a buffer of `BUFFERED` copies of `group`, one fewer groups asked for."""
    groups = [_regrouped(group, g) for g in range(BUFFERED + 1)]
    source = DataSource(groups[BUFFERED:], BUFFERED, load_function(path, "--buffer-filter-path"), args, 0)
    source.add_samples(groups[:BUFFERED])
    asked = BUFFERED - 1
    called = (
        f"--buffer-filter-path {path} called as buffer_filter(args, rollout_id 0, buffer, num_samples {asked}) "
        f"with a buffer of {BUFFERED} copies of {where}"
    )
    try:
        got = source.get_samples(asked)
    except PluginError as e:
        raise ValueError(f"{called}: {str(e).removeprefix('--buffer-filter-path ')}") from None
    except Exception as e:
        raise ValueError(f"{called}: raised {type(e).__name__}: {e}") from None
    bad = [type(s).__name__ for g in got for s in g if not isinstance(s, Sample)]
    if bad:
        raise ValueError(
            f"{called}: returned groups holding {bad[0]}, expected lists of rollout.sample.Sample"
        )
    taken = sum(1 for g in got if g and g[0].group_index != BUFFERED)  # the fresh group is number BUFFERED
    return (
        f"plug-in check: --buffer-filter-path {path} on a buffer of {BUFFERED} groups, {asked} asked: took {taken}, "
        f"left {len(source.buffer)} (copies of {where})"
    )


def _regrouped(group: list[Sample], g: int) -> list[Sample]:
    """A copy of `group` as prompt group `g` (sample indices g*n...)."""
    out = copy.deepcopy(group)
    for j, s in enumerate(out):
        s.group_index, s.index = g, g * len(out) + j
    return out
