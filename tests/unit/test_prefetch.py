"""tasks/prefetch.py: the next rollout's generation started by the parent is taken only by the generate task it
was started for, once, and an engine's error surfaces there."""

from __future__ import annotations

import asyncio

import pytest

from config import RunConfig
from engines.base import GenerateRequest
from tasks import actors, prefetch, stages


class _Method:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def remote(self, *args):
        self.calls.append(args)
        return asyncio.ensure_future(self.fn(*args))


class _Engine:
    def __init__(self, fail: bool = False) -> None:
        async def generate(part, ctx):
            await asyncio.sleep(0)
            if fail:
                raise RuntimeError("engine fault")
            return [f"out-{r.seed}" for r in part]

        self.generate = _Method(generate)


def _parts() -> list[list[GenerateRequest]]:
    return [[GenerateRequest(prompt_tokens=(1, 2), seed=s) for s in (0, 1)], []]


@pytest.fixture
def engines(monkeypatch):
    engines = [_Engine(), _Engine()]
    monkeypatch.setattr(actors, "engines", lambda cfg: engines)
    yield engines
    prefetch.drop()


def test_the_same_rollout_weights_and_requests_take_the_answers_once(engines):
    cfg = RunConfig()

    async def go():
        prefetch.start(cfg, 3, 3, "sha", _parts())
        answers = prefetch.take(cfg, 3, 3, "sha", _parts())
        assert answers is not None
        outputs, seconds = await answers
        assert outputs == [["out-0", "out-1"]] and seconds >= 0  # the empty part asks nobody
        assert prefetch.take(cfg, 3, 3, "sha", _parts()) is None  # taken once

    asyncio.run(go())
    assert engines[0].generate.calls == [(_parts()[0], {"rollout_id": 3, "attempt": 0})]
    assert engines[1].generate.calls == []


@pytest.mark.parametrize(
    "other",
    [
        (4, 3, "sha", _parts()),  # another rollout
        (3, 3, "other", _parts()),  # other weights
        (3, 3, "sha", [[GenerateRequest(prompt_tokens=(1, 2), seed=9)], []]),  # other requests
    ],
)
def test_anything_else_drops_it(engines, other):
    cfg = RunConfig()

    async def go():
        prefetch.start(cfg, 3, 3, "sha", _parts())
        assert prefetch.take(cfg, *other) is None
        assert prefetch.take(cfg, 3, 3, "sha", _parts()) is None  # dropped, not kept for later

    asyncio.run(go())


def test_an_engine_error_surfaces_in_the_taker_and_a_dropped_one_nowhere(monkeypatch):
    cfg = RunConfig()
    monkeypatch.setattr(actors, "engines", lambda cfg: [_Engine(fail=True), _Engine()])

    async def go():
        prefetch.start(cfg, 0, 0, "sha", _parts())
        answers = prefetch.take(cfg, 0, 0, "sha", _parts())
        assert answers is not None
        with pytest.raises(RuntimeError, match="engine fault"):
            await answers
        prefetch.start(cfg, 1, 0, "sha", _parts())
        await asyncio.sleep(0.01)  # it fails before anyone takes it
        prefetch.drop()

    asyncio.run(go())


@pytest.mark.parametrize(
    "debug",
    [
        {"debug_sequential_generation": True},
        {"debug_train_only": True},
        {"load_debug_rollout_data": "rec/rollout_{rollout_id}.parquet"},
    ],
)
def test_the_parent_starts_nothing_when_the_rollout_does_not_generate_or_is_told_not_to(monkeypatch, debug):
    started = []
    monkeypatch.setattr(prefetch, "start", lambda *a: started.append(a))
    stages.start_next_generation(RunConfig.model_validate({"debug": debug}), 1, None)  # type: ignore[arg-type]
    assert started == []
