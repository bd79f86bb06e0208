"""tasks/prefetch.py: the train step starts as the log-prob stage is done (or chained behind the parent's log-prob
pass) and is taken only by the train-step task with the same table."""

from __future__ import annotations

import asyncio

from config import RunConfig
from tasks import prefetch, stages
from tasks.refs import LogProbs, WeightsRef
from tests.unit.prefetch.fakes import ASKED, learning_chain, rollout_ref


def test_what_waits_for_a_stage_runs_once_for_that_stage_and_rollout_only():
    cfg, calls = RunConfig(), []
    prefetch.when(cfg, "generate", 3, calls.append)
    prefetch.done(cfg, "generate", 4, rollout_ref("4"))  # another rollout: not this callback's
    prefetch.done(cfg, "log-prob", 3, rollout_ref("3"))  # another stage
    prefetch.done(cfg, "generate", 3, rollout_ref("3"))
    # the flow's call after the task returned (a cached task writes nothing) finds the callback gone
    prefetch.done(cfg, "generate", 3, rollout_ref("3"))
    assert calls == [rollout_ref("3")]
    prefetch.when(cfg, "generate", 6, calls.append)
    prefetch.drop()  # the run ended: nothing waits any more
    prefetch.done(cfg, "generate", 6, rollout_ref("6"))
    assert calls == [rollout_ref("3")]


def test_the_train_step_starts_once_log_prob_is_done_and_the_sync_once_train_step_is_done(learners):
    order, trainers, engine = learners
    cfg, weights, table = RunConfig(), WeightsRef(version=2, sha256="w"), rollout_ref("c")

    async def go():
        stages.start_log_prob(cfg, 2, rollout_ref(), weights)
        assert [len(t.train_step.calls) for t in trainers] == [0, 0]  # not before log-prob is done
        prefetch.done(cfg, "log-prob", 2, LogProbs(table=table, stats={}))
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]  # submitted at once
        steps = await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")
        assert steps == [{"train/step": 1.0, "train/loss": 0.5}]
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]  # the task took them
        assert len(engine.resume_memory.calls) == 1  # train-step done: the sync started
        synced: list[WeightsRef] = []
        prefetch.when(cfg, "sync", 2, synced.append)
        assert await stages.sync.fn(cfg, 2) == WeightsRef(version=3, sha256="pushed")
        assert len(engine.resume_memory.calls) == 1  # the task took it
        assert synced == [WeightsRef(version=3, sha256="pushed")]  # what waits for the sync was told

    asyncio.run(go())
    trained = [o for o in order if o.startswith("train")]
    assert trained == ["train 0 on c attempt 0", "train 1 on c attempt 0"]
    assert order.index("resume") < order.index("push v3 attempt 0") and order.count("push v3 attempt 0") == 1


def test_a_train_step_started_for_another_log_prob_table_is_not_taken(learners):
    order, trainers, _ = learners
    cfg = RunConfig()

    async def go():
        stages.start_train_step(cfg, 2, rollout_ref(), rollout_ref("a"))
        await stages.train_step.fn(cfg, 2, rollout_ref(), rollout_ref("b"), "session")

    asyncio.run(go())
    assert [len(t.train_step.calls) for t in trainers] == [2, 2]  # the task asked again, with its own table
    assert "train 0 on b attempt 0" in order


def test_the_parents_chain_trains_behind_the_log_prob_pass_and_the_train_step_task_takes_it(
    monkeypatch, finisher
):
    order, trainers = learning_chain(monkeypatch, finisher)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")
    path = str(stages._paths(cfg).rollout(3))

    async def go():
        stages.start_next_generation(cfg, 3, weights)
        # the pass and the train step behind it are submitted with the generation
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]
        generated = await prefetch.take(cfg, 3, (3, "sha"), ASKED, path)  # type: ignore[misc]
        stages.start_log_prob(cfg, 3, generated.rollout, weights)  # generate's task has the file
        logprobs = await stages.log_prob.fn(cfg, 3, generated.rollout, weights)
        steps = await stages.train_step.fn(cfg, 3, generated.rollout, logprobs.table, "session")
        assert steps == [{"train/step": 1.0, "train/loss": 0.5}]

    asyncio.run(go())
    assert [len(t.train_step.calls) for t in trainers] == [1, 1]  # the task took the chained step
    assert order.index("stats") < order.index("train 0 on e attempt 0")  # the step ran on the written table


def test_a_chained_train_step_behind_a_pass_the_log_prob_task_did_not_take_is_not_taken(
    monkeypatch, finisher
):
    _, trainers = learning_chain(monkeypatch, finisher)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")

    async def go():
        stages.start_next_generation(cfg, 3, weights)
        await prefetch.take(cfg, 3, (3, "sha"), ASKED, str(stages._paths(cfg).rollout(3)))  # type: ignore[misc]
        # generate's task wrote another file (a retry): the log-prob task and the train step ask afresh
        stages.start_log_prob(cfg, 3, rollout_ref("9"), weights)
        logprobs = await stages.log_prob.fn(cfg, 3, rollout_ref("9"), weights)
        await stages.train_step.fn(cfg, 3, rollout_ref("9"), logprobs.table, "session")

    asyncio.run(go())
    assert [len(t.train_step.calls) for t in trainers] == [2, 2]
    assert trainers[0].train_step.calls[-1][0] == rollout_ref("9")
