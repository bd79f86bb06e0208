"""rollout/dynamic.py: slime's dynamic sampling filters and loop, the draws' prompts and seeds, and a whole dynamic
rollout on the tiny model's engine (no Ray)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from artifacts.schema import Sample as Row
from artifacts.store import read_rollout
from config import RunConfig
from config.slime_compat import refusal
from engines.base import EngineAnswer
from engines.torch_engine.engine import TorchEngine
from examples.dapo_filter.filters import mixed_and_finished
from flows.resolve import resolve
from rollout.dynamic import (
    DynamicFilterOutput,
    Selection,
    candidate_entries,
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
    dynamic_rollout,
    dynamic_sampling,
    first_position,
    judge,
    load_filter,
    logged_metrics,
    renumbered,
    select_groups,
)
from rollout.finish import finish_rollout
from rollout.requests import sample_seed
from rollout.sample import Sample, from_row
from tasks.stages import train_requests


def _row(group: int, index: int, reward: float, status: str = "completed") -> Row:
    return Row(0, group, index, "p", [1], "r", [2, 3], 2, "", reward, status, [1, 1], [], 0, index, {})


def _group(c: int, *rewards: float, status: str = "completed") -> list[Row]:
    return [_row(c, c * len(rewards) + j, r, status) for j, r in enumerate(rewards)]


def _slime(group: list[Row]) -> list[Sample]:
    return [from_row(r) for r in group]


def test_nonzero_std_filter_keeps_a_reward_spread() -> None:
    assert check_reward_nonzero_std(None, _slime(_group(0, 1.0, 0.0, 1.0))).keep
    same = check_reward_nonzero_std(None, _slime(_group(0, 1.0, 1.0)))
    assert (same.keep, same.reason, same.keep_when_insufficient) == (False, "zero_std_1.0", False)
    assert not check_reward_nonzero_std(None, _slime(_group(0, 0.5))).keep  # one sample: torch's std is NaN
    assert check_reward_nonzero_std_with_fallback(None, _slime(_group(0, 0.0, 0.0))).keep_when_insufficient
    slime_path = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    assert load_filter(slime_path) is check_reward_nonzero_std


def test_example_filter_drops_all_truncated_groups() -> None:
    cut = mixed_and_finished(None, _slime(_group(0, 1.0, 0.0, status="truncated")))
    assert (cut.keep, cut.reason) == (False, "all_truncated")
    assert mixed_and_finished(None, _slime(_group(0, 1.0, 0.0))).keep


def test_judge_reads_slimes_return_types() -> None:
    group = _slime(_group(0, 1.0, 0.0))
    assert judge(lambda a, s: True, None, group, "f").keep
    assert not judge(lambda a, s: np.bool_(False), None, group, "f").keep
    tensor = judge(
        lambda a, s: DynamicFilterOutput(keep=torch.tensor([1.0, 2.0]).std() > 1, reason="x"),
        None,
        group,
        "f",
    )
    assert (tensor.keep, tensor.reason) == (False, "x")  # slime's filter computes keep as a tensor
    with pytest.raises(TypeError, match="my.filter returned float for the group of sample 0"):
        judge(lambda a, s: 0.5, None, group, "my.filter")


def _run(
    target: int, over: int, groups: list[list[Row]], keep, max_drawn: int = 100
) -> tuple[Selection, list]:
    calls = []

    async def generate(first: int, count: int) -> list[list[Row]]:
        calls.append((first, count))
        return groups[first : first + count]

    return asyncio.run(select_groups(target, over, keep, generate, max_drawn)), calls


def _by_reward(group: list[Row]) -> DynamicFilterOutput:
    return check_reward_nonzero_std(None, _slime(group))


def test_loop_draws_until_the_batch_is_kept_and_discards_the_surplus() -> None:
    groups = [
        _group(0, 1, 1),
        _group(1, 0, 1),
        _group(2, 0, 0),
        _group(3, 1, 0),
        _group(4, 0, 1),
        _group(5, 1, 0),
    ]
    sel, calls = _run(2, 3, groups, _by_reward)
    assert [c for c, _ in sel.kept] == [1, 3] and calls == [(0, 3), (3, 3)]
    assert (sel.draws, sel.drawn, sel.dropped) == (2, 6, Counter({"zero_std_1.0": 1, "zero_std_0.0": 1}))
    assert sel.metrics()["rollout/dynamic_sampling/dropped_groups"] == 2.0
    assert sel.metrics()["rollout/dynamic_filter/drop_zero_std_1.0"] == 1.0
    # draws smaller than the batch: as many as fill it are made before generating
    sel, calls = _run(3, 2, groups, lambda g: DynamicFilterOutput(True))
    assert calls == [(0, 4)] and [c for c, _ in sel.kept] == [0, 1, 2] and sel.draws == 2


def test_keep_when_insufficient_keeps_rejects_rather_than_draw_again() -> None:
    groups = [_group(0, 1, 1), _group(1, 0, 1), _group(2, 0, 0), _group(3, 0, 1)]

    def fallback(g: list[Row]) -> DynamicFilterOutput:
        return check_reward_nonzero_std_with_fallback(None, _slime(g))

    sel, calls = _run(3, 3, groups, fallback)
    assert [c for c, _ in sel.kept] == [0, 1, 2] and calls == [(0, 3)] and not sel.dropped
    sel, calls = _run(2, 4, groups, fallback)  # enough left: the zero-std groups are dropped
    assert [c for c, _ in sel.kept] == [1, 3] and sel.dropped == Counter(
        {"zero_std_1.0": 1, "zero_std_0.0": 1}
    )


def test_a_filter_that_rejects_everything_is_stopped() -> None:
    groups = [_group(c, 1, 1) for c in range(10)]
    with pytest.raises(RuntimeError, match=r"drew 6 prompt groups and kept 0 of --rollout-batch-size 2"):
        _run(2, 3, groups, _by_reward, max_drawn=6)


def test_kept_groups_are_renumbered_and_remember_their_candidate() -> None:
    sel = Selection([(3, _group(3, 1, 0)), (5, _group(5, 0, 1))], 2, 6, Counter())
    rows = renumbered(sel, 2)
    assert [(r.group_index, r.sample_index) for r in rows] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert rows[2].metadata["dynamic_sampling"] == {"candidate_group": 5, "candidate_sample_index": 10}
    assert rows[2].seed == 10  # the seed it was sampled with


def test_draw_positions() -> None:
    assert [first_position(r, 4, 4) for r in range(3)] == [0, 4, 8]
    assert [first_position(r, 4, 6) for r in range(3)] == [0, 6, 12]
    assert [first_position(r, 5, 2) for r in range(3)] == [0, 6, 12]  # three draws of 2 before generating
    assert "no partial sample is left" in (refusal("--partial-rollout") or "")
    assert refusal("--mask-offpolicy-in-partial-rollout") == refusal("--partial-rollout")
    assert not dynamic_sampling(RunConfig.model_validate({"rollout": {"rollout_batch_size": 32}}))
    assert not dynamic_sampling(
        RunConfig.model_validate(
            {"rollout": {"rollout_batch_size": 32}, "sampling": {"over_sampling_batch_size": 32}}
        )
    )
    assert dynamic_sampling(RunConfig.model_validate({"sampling": {"dynamic_sampling_filter_path": "a.b"}}))
    assert dynamic_sampling(RunConfig.model_validate({"sampling": {"over_sampling_batch_size": 40}}))


class _Engine:
    """An engine actor's `generate.remote`, answered in process by the tiny model."""

    def __init__(self, engine: TorchEngine) -> None:
        self.engine, self.generate = engine, self

    def remote(self, requests, version, ctx=None):
        async def answer() -> EngineAnswer:
            return EngineAnswer(self.engine.generate(requests), 0.0)

        return answer()


@pytest.fixture(scope="module")
def tiny(base_checkpoint, tmp_path_factory):
    def cfg(**sampling) -> RunConfig:
        data = {
            "run_dir": str(tmp_path_factory.mktemp("run")),
            "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4},
            "train": {"global_batch_size": 16},
            "sampling": sampling,
        }
        return resolve(RunConfig.model_validate(data))[0]

    return cfg, [_Engine(TorchEngine(base_checkpoint))]


def test_a_keep_all_draw_of_the_batch_size_is_the_plain_rollout(tiny, tmp_path) -> None:
    make, engines = tiny
    cfg = make(dynamic_sampling_filter_path="tests.unit.test_dynamic_sampling.keep_all")
    assert candidate_entries(cfg, 3, 4) == train_requests(cfg, 3)
    # a draw beyond the first takes the next rollout's prompts again, with this rollout's seeds
    extra, following = candidate_entries(cfg, 3, 8)[16:], train_requests(cfg, 4)
    assert [e.prompt for e in extra] == [e.prompt for e in following]
    assert not {e.request.seed for e in extra} & {e.request.seed for e in following}

    ref, _ = asyncio.run(dynamic_rollout(cfg, 3, engines, 0, "w" * 64, str(tmp_path / "d.parquet")))
    plain, _ = asyncio.run(
        finish_rollout(
            cfg,
            3,
            train_requests(cfg, 3),
            engines[0].engine.generate([e.request for e in train_requests(cfg, 3)]),
            "w" * 64,
            tmp_path / "p.parquet",
        )
    )
    rows = read_rollout(ref)
    assert [
        dataclasses.replace(r, metadata={k: v for k, v in r.metadata.items() if k != "dynamic_sampling"})
        for r in rows
    ] == read_rollout(plain)
    assert logged_metrics(ref)["rollout/dynamic_sampling/drawn_groups"] == 4.0 and logged_metrics(plain) == {}


def test_a_dapo_rollout_keeps_groups_with_a_reward_spread_the_same_way_twice(tiny, tmp_path) -> None:
    make, engines = tiny
    cfg = make(
        over_sampling_batch_size=6,
        dynamic_sampling_filter_path="examples.dapo_filter.filters.mixed_and_finished",
    )
    refs = [
        asyncio.run(dynamic_rollout(cfg, 1, engines, 0, "w" * 64, str(tmp_path / f"{k}.parquet")))[0]
        for k in range(2)
    ]
    assert refs[0].sha256 == refs[1].sha256  # the seeds and the rollout id decide which groups are kept
    rows, counts = read_rollout(refs[0]), logged_metrics(refs[0])
    assert [r.sample_index for r in rows] == list(range(16)) and [r.group_index for r in rows] == [
        g for g in range(4) for _ in range(4)
    ]
    for g in range(4):
        assert len({r.reward for r in rows[g * 4 : g * 4 + 4]}) > 1
    assert counts["rollout/dynamic_sampling/kept_groups"] == 4.0
    assert counts["rollout/dynamic_sampling/drawn_groups"] == 6 * counts["rollout/dynamic_sampling/draws"]
    dropped = sum(v for k, v in counts.items() if k.startswith("rollout/dynamic_filter/drop_"))
    assert dropped == counts["rollout/dynamic_sampling/dropped_groups"]
    candidates = [r.metadata["dynamic_sampling"]["candidate_sample_index"] for r in rows]
    assert candidates == sorted(candidates) and all(
        r.seed == sample_seed(cfg.rollout.rollout_seed, 1, c) for r, c in zip(rows, candidates, strict=True)
    )


def keep_all(args, samples, **kwargs) -> bool:
    return True


def test_a_draw_under_a_custom_generate_function_samples_through_it(tiny, tmp_path) -> None:
    """rollflow's own single-turn generate as the plug-in: it samples the first call with the sample's seed, so the
    dynamic rollout holds the same responses and rewards as without the plug-in."""
    make, engines = tiny
    keep = "tests.unit.test_dynamic_sampling.keep_all"
    plain = make(dynamic_sampling_filter_path=keep)
    plugged = plain.model_copy(
        update={
            "rollout": plain.rollout.model_copy(
                update={"custom_generate_function_path": "rollout.plugins.generate"}
            )
        }
    )
    refs = [
        asyncio.run(dynamic_rollout(c, 2, engines, 0, "w" * 64, str(tmp_path / f"{k}.parquet")))[0]
        for k, c in enumerate((plain, plugged))
    ]
    a, b = (read_rollout(r) for r in refs)
    assert [(r.sample_index, r.response_tokens, r.reward) for r in a] == [
        (r.sample_index, r.response_tokens, r.reward) for r in b
    ]
