"""--buffer-filter-path: slime's buffer in the data source a rollout function gets, served first through the buffer
filter, and the checks made before a run starts."""

from __future__ import annotations

import pytest

from config import RunConfig
from examples.buffer_filter.retry import fewest_tries_first
from rollout.dynamic import check_sampling
from rollout.extensions import ExtensionError
from rollout.plugins import DataSource, PluginError, pop_first
from rollout.sample import Sample


def _groups(*indices: int, tries: int | None = None) -> list[list[Sample]]:
    out = []
    for g in indices:
        s = Sample(group_index=g, index=g, tokens=[1])
        if tries is not None:
            s.metadata["tries"] = tries
        out.append([s])
    return out


def test_given_back_groups_are_served_first_through_the_filter() -> None:
    calls = []

    def last_first(args, rollout_id, buffer, num_samples):
        calls.append((args, rollout_id, len(buffer), num_samples))
        taken = buffer[::-1][:num_samples]
        del buffer[len(buffer) - len(taken) :]
        return taken

    source = DataSource(_groups(0, 1, 2), 3, last_first, "ARGS", 7)
    first = source.get_samples(2)
    assert [g[0].index for g in first] == [0, 1] and not calls  # an empty buffer is not filtered
    source.add_samples(first)
    assert source.get_samples(2) == [first[1], first[0]] and calls == [("ARGS", 7, 2, 2)]
    source.add_samples([first[0]])
    assert [g[0].index for g in source.get_samples(2)] == [0, 2]  # the buffer's one, then a fresh one
    with pytest.raises(PluginError, match="asked for 1 more prompt groups but the rollout has 0 left"):
        source.get_samples(1)


def test_default_and_example_filters_take_from_the_buffer() -> None:
    buffer = _groups(0, 1, 2)
    assert [g[0].index for g in pop_first(None, 0, buffer, 2)] == [0, 1] and [g[0].index for g in buffer] == [
        2
    ]
    buffer = _groups(0, tries=3) + _groups(1, tries=2) + _groups(2, tries=2) + _groups(3)
    taken = fewest_tries_first(None, 0, buffer, 2)
    assert [g[0].index for g in taken] == [3, 1] and [g[0].index for g in buffer] == [0, 2]


def test_a_filter_must_return_at_most_the_groups_asked() -> None:
    source = DataSource(_groups(0, 1), 2, lambda a, r, buffer, n: list(buffer), None, 0)
    source.add_samples(source.get_samples(2))
    with pytest.raises(
        PluginError, match=r"--buffer-filter-path <lambda> returned list of 2 groups for 1 asked"
    ):
        source.get_samples(1)
    bad = DataSource(_groups(0), 1, lambda a, r, buffer, n: buffer[0], None, 0)
    bad.add_samples(bad.get_samples(1))
    with pytest.raises(PluginError, match="returned list of 1 groups for 1 asked"):
        bad.get_samples(1)


def test_a_buffer_filter_needs_a_rollout_function_and_an_importable_path() -> None:
    def cfg(**rollout) -> RunConfig:
        return RunConfig.model_validate(
            {
                "rollout": rollout,
                "sampling": {"buffer_filter_path": "examples.buffer_filter.retry.fewest_tries_first"},
            }
        )

    with pytest.raises(ValueError, match="--buffer-filter-path needs --rollout-function-path"):
        check_sampling(cfg())
    check_sampling(cfg(rollout_function_path="examples.buffer_filter.retry.generate_rollout"))
    with pytest.raises(
        ExtensionError, match="--dynamic-sampling-filter-path 'examples.nope.f': cannot import"
    ):
        check_sampling(
            RunConfig.model_validate({"sampling": {"dynamic_sampling_filter_path": "examples.nope.f"}})
        )
