"""tasks/prefetch.py: the weight sync goes out with the train step when the transfer can be chained, moves nothing
after a failed step, writes the step-boundary snapshot behind the export, and a retried sync applies the step again
only on trainers restored to the rollout before."""

from __future__ import annotations

import asyncio

import pytest

from config import RunConfig
from engines.base import GenerateRequest
from tasks import actors, prefetch, stages
from tasks.refs import WeightsRef
from tests.unit.prefetch.fakes import Learner, as_attempt, rollout_ref


def test_a_sync_is_started_only_for_a_run_whose_engines_take_the_weights(learners):
    _, _, engine = learners
    skip = RunConfig.model_validate({"debug": {"debug_skip_weight_update": True}})

    async def go():
        for cfg in (skip, RunConfig()):
            stages.start_train_step(cfg, 1, rollout_ref(), rollout_ref("c"))
            prefetch.done(cfg, "train-step", 1, [])
        assert len(engine.resume_memory.calls) == 1  # the run without --debug-skip-weight-update

    asyncio.run(go())


def test_the_weight_update_checkers_sync_never_takes_a_head_start(learners):
    """That sync scrambles the engines' weights first, which a head start does not."""
    order, _, engine = learners
    cfg = RunConfig()

    async def go():
        stages.start_sync(cfg, 1)
        await stages.sync.fn(cfg, 1, verify_equal=True)

    asyncio.run(go())
    # the head start pushed once, the task again after its own scramble
    assert sorted(order) == ["push v2 attempt 0", "push v2 attempt 0", "resume", "resume", "scramble"]
    assert [len(engine.snapshot_and_scramble.calls), len(engine.resume_memory.calls)] == [1, 2]


def test_a_sync_without_a_head_start_resumes_the_engines_and_pushes_itself(learners):
    order, _, engine = learners

    async def go():
        assert await stages.sync.fn(RunConfig(), 4) == WeightsRef(version=5, sha256="pushed")

    asyncio.run(go())
    assert order == ["resume", "push v5 attempt 0"] and len(engine.resume_memory.calls) == 1


@pytest.mark.parametrize("colocate", [False, True])
def test_a_sync_chained_on_the_train_step_goes_out_with_it_and_the_sync_task_takes_it(chained, colocate):
    order, engine, trainers, transfer = chained
    cfg, table = RunConfig.model_validate({"placement": {"colocate": colocate}}), rollout_ref("c")
    submitted_before = []  # how many transfers were submitted when each rank's snapshot was asked for
    for t in trainers:
        ask = t.write_snapshot.remote
        t.write_snapshot.remote = lambda *a, ask=ask: (submitted_before.append(transfer.submitted), ask(*a))[
            1
        ]

    async def go():
        stages.start_train_step(cfg, 2, rollout_ref(), table)
        # the engines' resume and the transfer are submitted with the step; the export runs behind every rank's
        # step, and colocated engines take their memory back only once the step is done
        assert [len(t.train_step.calls) for t in trainers] == [1, 1] and transfer.submitted == 1
        ((*steps,),) = engine.resume_memory.calls
        assert len(steps) == (2 if colocate else 0)
        await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")
        assert await stages.sync.fn(cfg, 2) == WeightsRef(version=3, sha256="pushed")

    asyncio.run(go())
    assert order.index("train 1 on c attempt 0") < order.index("export v3 attempt 0")
    assert not any(o.startswith("push") for o in order)  # the sync task pushed nothing itself
    assert [len(t.train_step.calls) for t in trainers] == [1, 1]
    # the step left its snapshot to the sync: asked for behind the transfer (each rank runs its calls in order)
    assert all(not t.train_step.calls[0][4] for t in trainers)
    assert submitted_before == [1, 1] and [t.snapshots for t in trainers] == [[2], [2]]


def test_a_step_whose_sync_cannot_be_chained_writes_its_snapshot_itself(learners):
    order, trainers, _ = learners  # a transfer that streams: no calls ahead of the weights

    async def go():
        stages.start_train_step(RunConfig(), 2, rollout_ref(), rollout_ref("c"))
        await stages.train_step.fn(RunConfig(), 2, rollout_ref(), rollout_ref("c"), "session")
        await stages.sync.fn(RunConfig(), 2)

    asyncio.run(go())
    assert all(t.train_step.calls[0][4] for t in trainers) and [t.snapshots for t in trainers] == [[2], [2]]
    assert order.index("snapshot 0 of 2") < order.index("push v3 attempt 0")
    assert [len(t.write_snapshot.calls) for t in trainers] == [0, 0]


@pytest.mark.parametrize(("restored", "trains_again"), [(1, True), (2, False), (0, None)])
def test_a_retried_sync_applies_the_step_again_only_on_trainers_restored_to_the_rollout_before(
    chained, monkeypatch, restored, trains_again
):
    """The trainers died after rollout 2's step, before its snapshot: re-created from rollout 1's, the retried
    sync trains rollout 2 again on its recorded inputs (the same bits) and writes its snapshot, then pushes."""
    order, _, trainers, _ = chained
    for t in trainers:
        t.applied = restored
    as_attempt(monkeypatch, 1)
    cfg = RunConfig()

    async def go():
        return await stages.sync.fn(cfg, 2, rollout=rollout_ref(), logprobs=rollout_ref("c"))

    if trains_again is None:
        with pytest.raises(RuntimeError, match=r"hold rollouts \[0\], not 2 .* --resume"):
            asyncio.run(go())
        return
    assert asyncio.run(go()) == WeightsRef(version=3, sha256="pushed")
    again = [o for o in order if o.startswith("train")]
    assert again == (["train 0 on c attempt 1", "train 1 on c attempt 1"] if trains_again else [])
    assert order.index("push v3 attempt 1") > (order.index("snapshot 0 of 2") if trains_again else -1)


def test_a_sync_chained_on_a_failed_train_step_moves_nothing_and_the_sync_pushes_after_the_retry(
    chained, monkeypatch
):
    order, engine, _, transfer = chained
    trainers = [Learner(0, order), Learner(1, order, fail_first=True)]
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    cfg, table = RunConfig(), rollout_ref("c")

    async def go():
        stages.start_train_step(cfg, 2, rollout_ref(), table)
        with pytest.raises(RuntimeError, match="train fault"):
            await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")
        as_attempt(monkeypatch, 1)
        await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")  # the retry: its own calls
        as_attempt(monkeypatch, 0)  # the sync task's first attempt
        assert await stages.sync.fn(cfg, 2) == WeightsRef(version=3, sha256="pushed")

    asyncio.run(go())
    assert not any(o.startswith("export") for o in order)  # the chained export never ran
    # the sync's own push after the retried step, then the snapshot the step left to it
    assert order[order.index("train 1 on c attempt 1") + 1 :][-3:] == [
        "resume",
        "push v3 attempt 0",
        "snapshot 1 of 2",
    ]
    assert [t.snapshots for t in trainers] == [[2], [2]]
    assert len(engine.resume_memory.calls) == 2


@pytest.mark.parametrize("evaluation", [False, True])
def test_the_next_rollouts_calls_go_out_behind_a_chained_sync_and_are_taken_once_it_synced(
    chained, evals, evaluation
):
    order, engine, _, transfer = chained
    cfg, table = RunConfig(), rollout_ref("c")
    parts = [[GenerateRequest(prompt_tokens=(1,), seed=0)]]

    async def go():
        # the parent, before rollout 2's flow run
        stages.ask_engines_after_sync(cfg, 2, generation=True, evaluation=evaluation)
        stages.start_train_step(cfg, 2, rollout_ref(), table)
        # the check's questions, eval 3's requests if it is due and rollout 3's generation are submitted with the
        # step, behind the transfer
        assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256)] == [1, 1]
        assert [call[0] for call in engine.generate.calls] == [*evals[: int(evaluation)], *parts]
        await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")
        weights = await stages.sync.fn(cfg, 2)
        assert (await stages.check.fn(cfg, 2, [], weights))["check/engines_in_sync"] == 1.0
        if evaluation:
            await stages.evaluate.fn(cfg, 3, weights)
        stages.start_next_generation(cfg, 3, weights, log_probs=False)
        path = str(stages._paths(cfg).rollout(3))
        generated = await prefetch.take(cfg, 3, (3, "pushed"), parts, path)  # type: ignore[misc]
        assert generated.rollout.path == path

    asyncio.run(go())
    # asked once each: the sync, the check, the eval and the generation took the chained calls
    assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256)] == [1, 1]
    assert len(engine.generate.calls) == 1 + evaluation
    assert transfer.submitted == 1 and not any(o.startswith("push") for o in order)


@pytest.mark.parametrize("evaluation", [False, True])
def test_after_a_chained_sync_that_failed_the_next_rollouts_calls_are_asked_afresh(
    chained, monkeypatch, finisher, evals, evaluation
):
    order, engine, _, transfer = chained
    transfer.fail_load = True
    cfg, table = RunConfig(), rollout_ref("c")

    async def go():
        stages.ask_engines_after_sync(cfg, 2, generation=True, evaluation=evaluation)
        stages.start_train_step(cfg, 2, rollout_ref(), table)
        await stages.train_step.fn(cfg, 2, rollout_ref(), table, "session")
        with pytest.raises(RuntimeError, match="engine load fault"):
            await stages.sync.fn(cfg, 2)
        as_attempt(monkeypatch, 1)
        weights = await stages.sync.fn(cfg, 2)  # the retry pushes itself; then the calls are asked again
        assert (await stages.check.fn(cfg, 2, [], weights))["check/engines_in_sync"] == 1.0
        if evaluation:
            as_attempt(monkeypatch, 0)  # the eval task's first attempt
            await stages.evaluate.fn(cfg, 3, weights)

    asyncio.run(go())
    assert order.count("push v3 attempt 1") == 1
    # the chained questions, eval and generation, then the ones asked after the retried sync (which the eval took)
    assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256)] == [2, 2]
    assert len(engine.generate.calls) == 2 * (1 + evaluation)
    if evaluation:
        ((*_, answer),) = finisher.finish_rollout.calls
        assert answer is engine.generate.answers[2]  # the eval asked after the retried sync
