"""--ci-test's re-generation check (engines/regenerate.py) on the embedded torch engine: a seeded engine passes it;
a planted bug (sampling that does not follow the request's seed alone) is named with the request and token."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from engines.base import GenerateRequest, SamplingParams
from engines.regenerate import NotReproduced, regenerate_and_compare
from engines.torch_engine.engine import TorchEngine


@pytest.fixture(scope="module")
def engine(base_checkpoint):
    return TorchEngine(base_checkpoint)


def _requests() -> list[GenerateRequest]:
    return [
        GenerateRequest((2, 7, 11, 14, 8, 7, 16, 3), seed=s, params=SamplingParams(max_new_tokens=6))
        for s in range(8)
    ]


def test_a_seeded_engine_re_generates_the_same_tokens(engine):
    requests = _requests()
    regenerate_and_compare(engine, requests, engine.generate(requests), 0, {"rollout_id": 3})


def test_sampling_that_drifts_from_the_seed_is_named(engine):
    calls = itertools.count()

    class Drifting:  # planted: each call shifts every seed (a global RNG in place of the per-request seed)
        def generate(self, requests):
            shift = next(calls)
            return engine.generate([dataclasses.replace(r, seed=r.seed + shift) for r in requests])

    drifting = Drifting()
    requests = _requests()
    with pytest.raises(NotReproduced) as e:
        regenerate_and_compare(drifting, requests, drifting.generate(requests), 1, {"rollout_id": 3})  # type: ignore[arg-type]
    assert re.fullmatch(
        r"generate is not deterministic: re-generating request 0 \(seed 0\) of rollout 3 on engine 1 with the "
        r"same weights gave response token \d+ = \S+ vs \S+",
        str(e.value),
    ), str(e.value)


def test_a_bf16_engine_re_generates_the_whole_call_in_its_layout(base_checkpoint):
    bf16 = TorchEngine(base_checkpoint, precision="bf16")
    assert not bf16.layout_invariant and TorchEngine.layout_invariant
    calls: list[int] = []

    class Counting:  # the check's own generate call carries every request, not the first two alone
        def generate(self, requests):
            calls.append(len(requests))
            return bf16.generate(requests)

    requests = _requests()
    regenerate_and_compare(
        Counting(), requests, bf16.generate(requests), 0, {"rollout_id": 3}, same_layout=True
    )  # type: ignore[arg-type]
    assert calls == [len(requests)]
