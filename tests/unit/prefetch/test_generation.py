"""tasks/prefetch.py: the next rollout's generation started by the parent (and the engines asked ahead of it, after
the sync, behind an eval's requests; the first rollout's as its flow run begins) is taken once, only by the generate
task of the same rollout, weights, requests and file (an eval's, by its eval task); an engine's error surfaces there."""

from __future__ import annotations

import asyncio

import pytest

from config import RunConfig
from engines.base import GenerateRequest
from tasks import actors, prefetch, stages
from tasks.refs import WeightsRef
from tests.unit.prefetch.fakes import (
    ASKED,
    ENTRIES,
    ROLLOUT_PATH,
    Engine,
    Held,
    learning_chain,
    start_generation,
    two_engine_parts,
)


def test_the_same_rollout_weights_requests_and_file_take_the_generation_once(engines, finisher):
    cfg = RunConfig()

    async def go():
        start_generation(cfg)
        answers = prefetch.take(cfg, 3, (3, "sha"), two_engine_parts(), ROLLOUT_PATH)
        assert answers is not None
        generated = await answers
        assert (
            generated.rollout.path == ROLLOUT_PATH and generated.tally.tokens == 4 and generated.seconds >= 0
        )
        assert prefetch.take(cfg, 3, (3, "sha"), two_engine_parts(), ROLLOUT_PATH) is None  # taken once

    asyncio.run(go())
    assert engines[0].generate.calls == [(two_engine_parts()[0], {"rollout_id": 3, "attempt": 0})]
    assert engines[1].generate.calls == []  # the empty part asks nobody
    # the rollout actor scores and writes, on the answers of the engines that had a part (refs Ray resolves)
    ((cfg_, rollout_id, entries, sha, path, answer),) = finisher.finish_rollout.calls
    assert (rollout_id, entries, sha, path) == (3, ENTRIES, "sha", ROLLOUT_PATH) and answer.result() == [
        "out-0",
        "out-1",
    ]


@pytest.mark.parametrize(
    "other",
    [
        (4, (3, "sha"), two_engine_parts(), ROLLOUT_PATH),  # another rollout
        (3, (3, "other"), two_engine_parts(), ROLLOUT_PATH),  # other weights
        (
            3,
            (3, "sha"),
            [[GenerateRequest(prompt_tokens=(1, 2), seed=9)], []],
            ROLLOUT_PATH,
        ),  # other requests
        (3, (3, "sha"), two_engine_parts(), "/run/rollouts/fresh_000003.parquet"),  # another file
    ],
)
def test_anything_else_drops_it(engines, other):
    cfg = RunConfig()

    async def go():
        start_generation(cfg)
        assert prefetch.take(cfg, *other) is None
        assert (
            prefetch.take(cfg, 3, (3, "sha"), two_engine_parts(), ROLLOUT_PATH) is None
        )  # dropped, not kept for later

    asyncio.run(go())


def test_an_engine_error_surfaces_in_the_taker_and_a_dropped_one_nowhere(monkeypatch):
    cfg = RunConfig()
    monkeypatch.setattr(actors, "engines", lambda cfg: [Engine(fail=True), Engine()])

    async def go():
        start_generation(cfg, rollout_id=0, weights=(0, "sha"))
        answers = prefetch.take(cfg, 0, (0, "sha"), two_engine_parts(), ROLLOUT_PATH)
        assert answers is not None
        with pytest.raises(RuntimeError, match="engine fault"):
            await answers
        start_generation(cfg, rollout_id=1, weights=(0, "sha"))
        await asyncio.sleep(0.01)  # it fails before anyone takes it
        prefetch.drop()

    asyncio.run(go())


@pytest.mark.parametrize(
    "debug",
    [
        {"debug_sequential_stages": True},
        {"debug_train_only": True},
        {"load_debug_rollout_data": "rec/rollout_{rollout_id}.parquet"},
    ],
)
def test_the_parent_starts_nothing_when_the_rollout_does_not_generate_or_is_told_not_to(monkeypatch, debug):
    started = []
    monkeypatch.setattr(prefetch, "start", lambda *a: started.append(a))
    stages.start_next_generation(RunConfig.model_validate({"debug": debug}), 1, None)  # type: ignore[arg-type]
    assert started == []


def test_engines_asked_ahead_are_scored_and_written_by_the_start_for_the_same_rollout(engines, finisher):
    cfg = RunConfig()

    async def go():
        prefetch.ask_engines(cfg, 3, (3, "sha"), two_engine_parts())
        assert (
            len(engines[0].generate.calls) == 1 and finisher.finish_rollout.calls == []
        )  # nothing written yet
        start_generation(cfg)
        generated = await prefetch.take(cfg, 3, (3, "sha"), two_engine_parts(), ROLLOUT_PATH)  # type: ignore[misc]
        assert generated.rollout.path == ROLLOUT_PATH

    asyncio.run(go())
    assert engines[0].generate.calls == [
        (two_engine_parts()[0], {"rollout_id": 3, "attempt": 0})
    ]  # asked once
    ((*_, answer),) = finisher.finish_rollout.calls
    assert answer.result() == ["out-0", "out-1"]


@pytest.mark.parametrize(
    "other",
    [
        (4, (3, "sha"), two_engine_parts()),  # another rollout
        (3, (3, "other"), two_engine_parts()),  # other weights
        (3, (3, "sha"), [[GenerateRequest(prompt_tokens=(1, 2), seed=9)], []]),  # other requests
    ],
)
def test_engines_asked_ahead_for_anything_else_are_dropped_and_asked_afresh(engines, finisher, other):
    cfg = RunConfig()

    async def go():
        prefetch.ask_engines(cfg, *other)
        start_generation(cfg)
        await prefetch.take(cfg, 3, (3, "sha"), two_engine_parts(), ROLLOUT_PATH)  # type: ignore[misc]

    asyncio.run(go())
    assert engines[0].generate.calls[-1] == (two_engine_parts()[0], {"rollout_id": 3, "attempt": 0})
    assert len(engines[0].generate.calls) == 2


def test_after_the_sync_the_checks_questions_then_the_next_generation_go_to_the_engines(
    monkeypatch, finisher
):
    order: list[str] = []
    engine = Held(order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="pushed")

    async def go():
        stages.ask_engines_after_sync(cfg, 2, generation=True, evaluation=False)
        assert engine.generate.calls == []  # not before rollout 2's sync
        prefetch.done(cfg, "sync", 2, weights)
        assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256, engine.generate)] == [
            1,
            1,
            1,
        ]
        result = await stages.check.fn(cfg, 2, [], weights)
        assert result["check/engines_in_sync"] == 1.0
        assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256)] == [
            1,
            1,
        ]  # check took them
        stages.start_next_generation(cfg, 3, weights, log_probs=False)
        path = str(stages._paths(cfg).rollout(3))
        await prefetch.take(cfg, 3, (3, "pushed"), [[entry.request]], path)  # type: ignore[misc]
        prefetch.drop()

    asyncio.run(go())
    assert order == ["weight_version", "weights_sha256", "generate 3"]  # generated once, after the questions
    assert len(finisher.finish_rollout.calls) == 1


def test_after_the_sync_the_eval_due_then_the_next_generation_go_to_the_engines_and_each_task_takes_its_own(
    monkeypatch, finisher, evals
):
    order: list[str] = []
    engine = Held(order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="pushed")

    async def go():
        stages.ask_engines_after_sync(cfg, 2, generation=True, evaluation=True)
        prefetch.done(cfg, "sync", 2, weights)
        # the check's questions, eval 3's requests, then rollout 3's, in that order on the engine
        assert [call[0] for call in engine.generate.calls] == [evals[0], [entry.request]]
        await stages.check.fn(cfg, 2, [], weights)
        assert await stages.evaluate.fn(cfg, 3, weights) == {"eval/arith": 1.0}
        stages.start_next_generation(cfg, 3, weights, log_probs=False)
        path = str(stages._paths(cfg).rollout(3))
        await prefetch.take(cfg, 3, (3, "pushed"), [[entry.request]], path)  # type: ignore[misc]

    asyncio.run(go())
    assert len(engine.generate.calls) == 2  # each asked once: the eval and generate tasks took their calls
    (eval_write, rollout_write) = finisher.finish_rollout.calls
    assert eval_write[4].endswith("eval_000003.parquet") and eval_write[-1].result() == ["out-70"]
    assert rollout_write[4].endswith("rollout_000003.parquet")


@pytest.mark.parametrize("other", [{"eval_id": 4}, {"weights": WeightsRef(version=3, sha256="other")}])
def test_an_eval_asked_ahead_for_another_eval_or_other_weights_is_asked_afresh(
    monkeypatch, finisher, evals, other
):
    engine = Held([])
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="pushed")
    asked = {"eval_id": 3, "weights": weights, **other}

    async def go():
        stages.ask_engines_after_sync(cfg, 2, generation=False, evaluation=True)
        prefetch.done(cfg, "sync", 2, weights)
        await stages.evaluate.fn(cfg, asked["eval_id"], asked["weights"])

    asyncio.run(go())
    assert len(engine.generate.calls) == 2
    ((*_, answer),) = finisher.finish_rollout.calls
    assert answer is engine.generate.answers[1]  # scored the answers the task asked for


@pytest.mark.parametrize("evaluation", [True, False])
def test_the_first_rollout_asks_for_its_eval_then_its_generation_as_its_flow_run_begins(
    monkeypatch, finisher, evals, evaluation
):
    _, trainers = learning_chain(monkeypatch, finisher)
    cfg, weights = RunConfig(), WeightsRef(version=0, sha256="w0")
    (engine,) = actors.engines(cfg)

    async def go():
        prefetch.when(cfg, "begin", 0, lambda w: stages.start_first_rollout(cfg, 0, w, evaluation))
        assert engine.generate.calls == []
        prefetch.done(cfg, "begin", 0, weights)  # rollout 0's flow run begins
        assert [call[0] for call in engine.generate.calls] == [*evals[: int(evaluation)], *ASKED]
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]  # its pass and step chained behind
        if evaluation:
            await stages.evaluate.fn(cfg, 0, weights)
        generated = prefetch.take(cfg, 0, (0, "w0"), ASKED, str(stages._paths(cfg).rollout(0)))
        assert generated is not None
        await generated

    asyncio.run(go())
    assert len(engine.generate.calls) == (2 if evaluation else 1)


@pytest.mark.parametrize(
    "debug",
    [
        {"debug_rollout_only": True},  # no sync
        {"debug_skip_weight_update": True},  # no weights reach the engines
        {"debug_sequential_stages": True},
        {"debug_train_only": True},
    ],
)
def test_nothing_is_asked_after_a_sync_that_moves_no_weights_or_when_told_not_to(monkeypatch, debug):
    asked = []
    monkeypatch.setattr(prefetch, "ask_engines", lambda *a: asked.append(a))
    cfg = RunConfig.model_validate({"debug": debug})
    stages.ask_engines_after_sync(cfg, 2, generation=True, evaluation=False)
    prefetch.done(cfg, "sync", 2, WeightsRef(version=3, sha256="w"))
    assert asked == []
