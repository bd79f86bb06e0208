"""Bad plug-ins: slime's loss and sampling plug-in flags, and plug-ins of the wrong signature that `run --dry-run`
calls on probe samples (rollout/plugin_check.py), each given another plug-in's path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.bad_inputs.common import Case, _jsonl, run

PLUGIN_FLAG_CASES: list[Case] = [
    run(
        "--loss-type",
        "custom_loss",
        needle="needs --custom-loss-function-path",
        kind="combination",
        what="a custom loss without its path",
    ),
    run(
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "nowhere_xyz.loss",
        needle="cannot import 'nowhere_xyz'",
        kind="path",
        what="a custom loss that does not import",
    ),
    run(
        "--dynamic-sampling-filter-path",
        "nowhere_xyz.keep",
        needle="cannot import 'nowhere_xyz'",
        kind="path",
        what="a dynamic sampling filter that does not import",
    ),
    run(
        "--buffer-filter-path",
        "examples.buffer_filter.retry.fewest_tries_first",
        needle="needs --rollout-function-path",
        kind="combination",
        what="a buffer filter without a rollout function to serve",
    ),
    run(
        "--partial-rollout",
        needle="no partial sample is left",
        kind="combination",
        what="slime's --partial-rollout",
    ),
]


def _dry_run(*flags: str) -> Callable[[Path], list[str]]:
    """`run --dry-run` with `flags`, on a one-prompt file with a label that the tiny tokenizer encodes."""

    def argv(tmp: Path) -> list[str]:
        data = _jsonl(tmp, '{"input": "1+2=", "label": "3"}\n', "sums")  # prompts the tiny tokenizer encodes
        return [
            "run",
            "--dry-run",
            "--run-dir",
            str(tmp / "run"),
            "--prompt-data",
            data,
            "--label-key",
            "label",
            *flags,
        ]

    return argv


DRY_RUN_CASES: list[Case] = [
    Case(
        "plug-in",
        "`run --dry-run`: a --group-rm reward that returns a filter's verdict",
        _dry_run("--custom-rm-path", "examples.dapo_filter.filters.mixed_and_finished", "--group-rm"),
        "called as reward(args, samples) on a group of 1 sample of --prompt-data",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a dynamic sampling filter of another signature",
        _dry_run("--rm-type", "exact_match", "--dynamic-sampling-filter-path", "rollout.sample.label_text"),
        "called as filter(args, samples) on a group of 1 sample of --prompt-data",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a dynamic sampling filter given as the buffer filter",
        _dry_run(
            "--rm-type",
            "exact_match",
            "--rollout-function-path",
            "examples.buffer_filter.retry.generate_rollout",
            "--buffer-filter-path",
            "examples.dapo_filter.filters.mixed_and_finished",
        ),
        "mixed_and_finished() takes 2 positional arguments but 4 were given",
    ),
    Case(
        "plug-in",
        "`run --dry-run`: a buffer filter given as the custom loss",
        _dry_run(
            "--rm-type",
            "exact_match",
            "--loss-type",
            "custom_loss",
            "--custom-loss-function-path",
            "rollout.plugins.pop_first",
        ),
        "called as a trainer calls it on a synthetic micro-batch of 2 samples",
    ),
]
