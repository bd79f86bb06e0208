"""tasks/prefetch.py: a rollout's log-prob pass, started as the file is written (or chained behind the generation by
the parent), is taken once, only by the log-prob task of the same rollout, artifact, weights and output; a trainer's
error surfaces there."""

from __future__ import annotations

import asyncio

import pytest

from config import RunConfig
from engines.base import GenerateRequest
from tasks import actors, prefetch, stages
from tasks.refs import WeightsRef
from tests.unit.prefetch.fakes import (
    ROLLOUT_PATH,
    Engine,
    Releasing,
    Trainer,
    one_engine_parts,
    rollout_ref,
    start_generation,
)


def test_a_log_prob_pass_runs_in_the_tasks_order_and_is_taken_once_by_its_rollout(log_prob_actors):
    cfg, weights = RunConfig(), WeightsRef(version=2, sha256="w")

    async def go():
        prefetch.start_log_probs(cfg, 2, rollout_ref(), weights, "/run/lp.parquet")
        answers = prefetch.take_log_probs(cfg, 2, rollout_ref(), weights, "/run/lp.parquet")
        assert answers is not None
        assert await answers == [
            "/run/lp.parquet@" + "1" * 64,
            None,
            {"written": "/run/lp.parquet@" + "1" * 64},
        ]
        assert prefetch.take_log_probs(cfg, 2, rollout_ref(), weights, "/run/lp.parquet") is None

    asyncio.run(go())
    # each trainer's pass depends on the engines' release (one ref each), not on an await in the caller
    assert log_prob_actors == ["release", "log-probs 0 after 1", "log-probs 1 after 1", "stats"]


def test_a_log_prob_pass_is_submitted_before_the_caller_awaits_anything(monkeypatch):
    """The caller's event loop may be held by a task's own work for tens of ms: the calls go out at once."""
    order: list[str] = []
    engine, trainer = Releasing(order), Trainer(0, order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [trainer])
    cfg, weights = RunConfig(), WeightsRef(version=2, sha256="w")

    async def go():
        prefetch.start_log_probs(cfg, 2, rollout_ref(), weights, "/run/lp.parquet")
        submitted = [
            len(m.calls) for m in (engine.release_memory, trainer.compute_log_probs, trainer.rollout_stats)
        ]
        assert submitted == [1, 1, 1]
        answers = prefetch.take_log_probs(cfg, 2, rollout_ref(), weights, "/run/lp.parquet")
        assert answers is not None
        await answers

    asyncio.run(go())
    assert order == ["release", "log-probs 0 after 1", "stats"]


@pytest.mark.parametrize(
    "other",
    [
        (3, rollout_ref(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet"),  # another rollout id
        (2, rollout_ref("2"), WeightsRef(version=2, sha256="w"), "/run/lp.parquet"),  # another artifact
        (2, rollout_ref(), WeightsRef(version=2, sha256="v"), "/run/lp.parquet"),  # other weights
        (2, rollout_ref(), WeightsRef(version=2, sha256="w"), "/run/other.parquet"),  # another output
    ],
)
def test_a_log_prob_pass_for_anything_else_is_dropped(log_prob_actors, other):
    cfg = RunConfig()

    async def go():
        prefetch.start_log_probs(cfg, 2, rollout_ref(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet")
        assert prefetch.take_log_probs(cfg, *other) is None
        assert (
            prefetch.take_log_probs(
                cfg, 2, rollout_ref(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet"
            )
            is None
        )

    asyncio.run(go())


def test_a_trainer_error_surfaces_in_the_log_prob_taker(monkeypatch):
    cfg, weights, order = RunConfig(), WeightsRef(version=0, sha256="w"), []
    monkeypatch.setattr(actors, "engines", lambda cfg: [])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [Trainer(0, order, fail=True)])

    async def go():
        prefetch.start_log_probs(cfg, 0, rollout_ref(), weights, "/run/lp.parquet")
        answers = prefetch.take_log_probs(cfg, 0, rollout_ref(), weights, "/run/lp.parquet")
        assert answers is not None
        with pytest.raises(RuntimeError, match="trainer fault"):
            await answers

    asyncio.run(go())


@pytest.mark.parametrize("debug", [{"debug_sequential_stages": True}, {"debug_rollout_only": True}])
def test_the_flow_starts_no_log_prob_pass_when_the_rollout_does_not_train_or_is_told_not_to(
    monkeypatch, debug
):
    started = []
    monkeypatch.setattr(prefetch, "start_log_probs", lambda *a: started.append(a))
    cfg = RunConfig.model_validate({"debug": debug})
    stages.start_log_prob(cfg, 1, rollout_ref(), WeightsRef(version=1, sha256="w"))
    assert started == []
    stages.start_log_prob(RunConfig(), 1, rollout_ref(), WeightsRef(version=1, sha256="w"))
    assert len(started) == 1


def test_a_chained_log_prob_pass_follows_the_written_file_and_the_log_prob_stage_takes_it(chain):
    order, engine, trainers = chain
    cfg, weights, out = RunConfig(), WeightsRef(version=3, sha256="sha"), "/run/lp.parquet"

    async def go():
        start_generation(cfg, parts=one_engine_parts(), log_probs_out=out)
        # every call goes out at once: the trainers' passes wait for the file's ref and the engines' release
        assert [len(m.calls) for m in (engine.release_memory, *[t.compute_log_probs for t in trainers])] == [
            1,
            1,
            1,
        ]
        answers = prefetch.take(cfg, 3, (3, "sha"), one_engine_parts(), ROLLOUT_PATH)
        assert answers is not None
        rollout = (await answers).rollout
        prefetch.start_log_probs(
            cfg, 3, rollout, weights, out
        )  # what generate's task asks once it has the file
        assert len(trainers[0].compute_log_probs.calls) == 1  # the chained pass, not a second one
        taken = prefetch.take_log_probs(cfg, 3, rollout, weights, out)
        assert taken is not None
        assert await taken == [f"{out}@{rollout.sha256}", None, {"written": f"{out}@{rollout.sha256}"}]

    asyncio.run(go())
    assert order == ["release", "log-probs 0 after 1", "log-probs 1 after 1", "stats"]


@pytest.mark.parametrize(
    "other",
    [
        {"rollout": rollout_ref("9")},  # generate wrote another file (a retry, a cached task)
        {"weights": WeightsRef(version=3, sha256="other")},
        {"out": "/run/other.parquet"},
    ],
)
def test_a_chained_log_prob_pass_for_anything_else_is_dropped_and_the_pass_asked_afresh(chain, other):
    order, engine, trainers = chain
    cfg = RunConfig()

    async def go():
        start_generation(cfg, parts=one_engine_parts(), log_probs_out="/run/lp.parquet")
        generated = await prefetch.take(cfg, 3, (3, "sha"), one_engine_parts(), ROLLOUT_PATH)  # type: ignore[misc]
        asked = {
            "rollout": generated.rollout,
            "weights": WeightsRef(version=3, sha256="sha"),
            "out": "/run/lp.parquet",
        }
        asked.update(other)
        prefetch.start_log_probs(cfg, 3, asked["rollout"], asked["weights"], asked["out"])
        assert len(trainers[0].compute_log_probs.calls) == 2
        taken = prefetch.take_log_probs(cfg, 3, asked["rollout"], asked["weights"], asked["out"])
        assert taken is not None
        assert (await taken)[0] == f"{asked['out']}@{asked['rollout'].sha256}"

    asyncio.run(go())


def test_a_chained_log_prob_pass_on_a_failed_generation_is_dropped(monkeypatch):
    order: list[str] = []
    engine = Engine(fail=True)
    engine.release_memory = Releasing(order).release_memory
    trainer = Trainer(0, order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [trainer])
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")

    async def go():
        start_generation(cfg, parts=one_engine_parts(), log_probs_out="/run/lp.parquet")
        answers = prefetch.take(cfg, 3, (3, "sha"), one_engine_parts(), ROLLOUT_PATH)
        with pytest.raises(RuntimeError, match="engine fault"):
            await answers  # type: ignore[misc]
        prefetch.start_log_probs(cfg, 3, rollout_ref(), weights, "/run/lp.parquet")  # the retry's file
        taken = prefetch.take_log_probs(cfg, 3, rollout_ref(), weights, "/run/lp.parquet")
        assert taken is not None
        assert (await taken)[0] == "/run/lp.parquet@" + "1" * 64
        prefetch.drop()

    asyncio.run(go())
    assert len(trainer.compute_log_probs.calls) == 2


@pytest.mark.parametrize(
    ("settings", "chained"),
    [
        ({}, True),
        ({"debug": {"debug_rollout_only": True}}, False),  # nothing trains on it
        (
            {"debug": {"ci_inject_rollout_data_path": "rec/rollout_{rollout_id}.parquet"}},
            False,
        ),  # a recording is
        ({"log_probs": False}, False),  # the trainers save a checkpoint first
    ],
)
def test_the_parent_chains_the_log_prob_pass_only_when_the_rollout_trains_on_its_generation(
    monkeypatch, settings, chained
):
    started, trains = [], []
    monkeypatch.setattr(prefetch, "start", lambda *a, train: (started.append(a), trains.append(train)))
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    cfg = RunConfig.model_validate(
        {"run_dir": "/run", **{k: v for k, v in settings.items() if k != "log_probs"}}
    )
    stages.start_next_generation(cfg, 1, WeightsRef(version=1, sha256="w"), settings.get("log_probs", True))
    ((_, rollout_id, weights, entries, parts, path, log_probs_out),) = started
    assert (rollout_id, weights, entries, parts) == (1, (1, "w"), [entry], [[entry.request]])
    injected = "ci_inject_rollout_data_path" in settings.get("debug", {})
    assert path.endswith("fresh_000001.parquet" if injected else "rollout_000001.parquet")
    assert (log_probs_out is not None) == chained
