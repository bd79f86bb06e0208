"""tasks/prefetch.py: the next rollout's generation started by the parent, and a rollout's log-prob pass, train step
and weight sync started by its flow run as the stage before each is done, are taken only by the task they were
started for, once, and an actor's error surfaces there."""

from __future__ import annotations

import asyncio

import pytest

from artifacts.store import ArtifactRef
from config import RunConfig
from engines.base import GenerateRequest
from rollout.finish import Tally
from tasks import actors, prefetch, stages
from tasks.refs import LogProbs, WeightsRef
from tasks.transfer import FullTransfer, Pushed


class _Method:
    def __init__(self, fn, num_returns: int = 1):
        self.fn, self.calls, self.answers, self.num_returns = fn, [], [], num_returns

    def remote(self, *args, **kwargs):
        """As Ray runs an actor call: once every object ref (here, future) among its arguments is done, on their
        values; `num_returns` > 1: one ref per item of what the call returns."""
        self.calls.append(args)

        async def run():
            return await self.fn(*[await a if isinstance(a, asyncio.Future) else a for a in args], **kwargs)

        answer = asyncio.ensure_future(run())
        self.answers.append(answer)
        if self.num_returns == 1:
            return answer

        async def item(i):
            return (await answer)[i]

        return [asyncio.ensure_future(item(i)) for i in range(self.num_returns)]


class _Engine:
    """generate answers `out-<seed>` per request."""

    def __init__(self, fail: bool = False) -> None:
        async def generate(part, ctx):
            await asyncio.sleep(0)
            if fail:
                raise RuntimeError("engine fault")
            return [f"out-{r.seed}" for r in part]

        self.generate = _Method(generate)


class _Finisher:
    """The rollout actor: finish_rollout "writes" the rollout the engines' answers make."""

    def __init__(self) -> None:
        async def finish_rollout(
            cfg, rollout_id, entries, weights_sha256, path, *answers, eval_mode=False, ctx=None
        ):
            return (
                ArtifactRef(
                    path=path, sha256=_sha(answers), rows=len(entries), schema_version=1, kind="rollout"
                ),
                Tally(tokens=4, longest=2, seconds=0.0),
            )

        self.finish_rollout = _Method(finish_rollout, num_returns=2)


@pytest.fixture(autouse=True)
def finisher(monkeypatch):
    finisher = _Finisher()
    monkeypatch.setattr(actors, "rollout_actor", lambda cfg: finisher)
    return finisher


def _sha(answers) -> str:
    return (str(len(answers)) * 64)[:64]


def _parts() -> list[list[GenerateRequest]]:
    return [[GenerateRequest(prompt_tokens=(1, 2), seed=s) for s in (0, 1)], []]


_ENTRIES = [
    "entry-0",
    "entry-1",
]  # what the rollout actor scores the answers with: passed through as they are
_PATH = "/run/rollouts/rollout_000003.parquet"


@pytest.fixture
def engines(monkeypatch):
    engines = [_Engine(), _Engine()]
    monkeypatch.setattr(actors, "engines", lambda cfg: engines)
    yield engines
    prefetch.drop()


def _start(cfg, rollout_id=3, weights=(3, "sha"), parts=None, path=_PATH, log_probs_out=None):
    prefetch.start(cfg, rollout_id, weights, _ENTRIES, parts or _parts(), path, log_probs_out)


def test_the_same_rollout_weights_requests_and_file_take_the_generation_once(engines, finisher):
    cfg = RunConfig()

    async def go():
        _start(cfg)
        answers = prefetch.take(cfg, 3, (3, "sha"), _parts(), _PATH)
        assert answers is not None
        generated = await answers
        assert generated.rollout.path == _PATH and generated.tally.tokens == 4 and generated.seconds >= 0
        assert prefetch.take(cfg, 3, (3, "sha"), _parts(), _PATH) is None  # taken once

    asyncio.run(go())
    assert engines[0].generate.calls == [(_parts()[0], {"rollout_id": 3, "attempt": 0})]
    assert engines[1].generate.calls == []  # the empty part asks nobody
    # the rollout actor scores and writes, on the answers of the engines that had a part (refs Ray resolves)
    ((cfg_, rollout_id, entries, sha, path, answer),) = finisher.finish_rollout.calls
    assert (rollout_id, entries, sha, path) == (3, _ENTRIES, "sha", _PATH) and answer.result() == [
        "out-0",
        "out-1",
    ]


@pytest.mark.parametrize(
    "other",
    [
        (4, (3, "sha"), _parts(), _PATH),  # another rollout
        (3, (3, "other"), _parts(), _PATH),  # other weights
        (3, (3, "sha"), [[GenerateRequest(prompt_tokens=(1, 2), seed=9)], []], _PATH),  # other requests
        (3, (3, "sha"), _parts(), "/run/rollouts/fresh_000003.parquet"),  # another file
    ],
)
def test_anything_else_drops_it(engines, other):
    cfg = RunConfig()

    async def go():
        _start(cfg)
        assert prefetch.take(cfg, *other) is None
        assert prefetch.take(cfg, 3, (3, "sha"), _parts(), _PATH) is None  # dropped, not kept for later

    asyncio.run(go())


def test_an_engine_error_surfaces_in_the_taker_and_a_dropped_one_nowhere(monkeypatch):
    cfg = RunConfig()
    monkeypatch.setattr(actors, "engines", lambda cfg: [_Engine(fail=True), _Engine()])

    async def go():
        _start(cfg, rollout_id=0, weights=(0, "sha"))
        answers = prefetch.take(cfg, 0, (0, "sha"), _parts(), _PATH)
        assert answers is not None
        with pytest.raises(RuntimeError, match="engine fault"):
            await answers
        _start(cfg, rollout_id=1, weights=(0, "sha"))
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


class _Trainer:
    def __init__(self, rank: int, order: list[str], fail: bool = False) -> None:
        async def compute_log_probs(rollout, out, *after):
            order.append(f"log-probs {rank} after {len(after)}")
            if fail:
                raise RuntimeError("trainer fault")
            return f"{out}@{rollout.sha256}" if rank == 0 else None

        async def rollout_stats(rollout, written):
            order.append("stats")
            return {"written": written}

        self.compute_log_probs, self.rollout_stats = _Method(compute_log_probs), _Method(rollout_stats)


class _Releasing:
    def __init__(self, order: list[str]) -> None:
        async def release_memory():
            await asyncio.sleep(0.01)  # the trainers must wait for it
            order.append("release")

        self.release_memory = _Method(release_memory)


def _rollout(sha: str = "1") -> ArtifactRef:
    return ArtifactRef(path="/run/rollout.parquet", sha256=sha * 64, rows=2, schema_version=1, kind="rollout")


@pytest.fixture
def log_prob_actors(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(actors, "engines", lambda cfg: [_Releasing(order)])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [_Trainer(0, order), _Trainer(1, order)])
    yield order
    prefetch.drop()


def test_a_log_prob_pass_runs_in_the_tasks_order_and_is_taken_once_by_its_rollout(log_prob_actors):
    cfg, weights = RunConfig(), WeightsRef(version=2, sha256="w")

    async def go():
        prefetch.start_log_probs(cfg, 2, _rollout(), weights, "/run/lp.parquet")
        answers = prefetch.take_log_probs(cfg, 2, _rollout(), weights, "/run/lp.parquet")
        assert answers is not None
        assert await answers == [
            "/run/lp.parquet@" + "1" * 64,
            None,
            {"written": "/run/lp.parquet@" + "1" * 64},
        ]
        assert prefetch.take_log_probs(cfg, 2, _rollout(), weights, "/run/lp.parquet") is None

    asyncio.run(go())
    # each trainer's pass depends on the engines' release (one ref each), not on an await in the caller
    assert log_prob_actors == ["release", "log-probs 0 after 1", "log-probs 1 after 1", "stats"]


def test_a_log_prob_pass_is_submitted_before_the_caller_awaits_anything(monkeypatch):
    """The caller's event loop may be held by a task's own work for tens of ms: the calls go out at once."""
    order: list[str] = []
    engine, trainer = _Releasing(order), _Trainer(0, order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [trainer])
    cfg, weights = RunConfig(), WeightsRef(version=2, sha256="w")

    async def go():
        prefetch.start_log_probs(cfg, 2, _rollout(), weights, "/run/lp.parquet")
        submitted = [
            len(m.calls) for m in (engine.release_memory, trainer.compute_log_probs, trainer.rollout_stats)
        ]
        assert submitted == [1, 1, 1]
        answers = prefetch.take_log_probs(cfg, 2, _rollout(), weights, "/run/lp.parquet")
        assert answers is not None
        await answers

    asyncio.run(go())
    assert order == ["release", "log-probs 0 after 1", "stats"]


@pytest.mark.parametrize(
    "other",
    [
        (3, _rollout(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet"),  # another rollout id
        (2, _rollout("2"), WeightsRef(version=2, sha256="w"), "/run/lp.parquet"),  # another artifact
        (2, _rollout(), WeightsRef(version=2, sha256="v"), "/run/lp.parquet"),  # other weights
        (2, _rollout(), WeightsRef(version=2, sha256="w"), "/run/other.parquet"),  # another output
    ],
)
def test_a_log_prob_pass_for_anything_else_is_dropped(log_prob_actors, other):
    cfg = RunConfig()

    async def go():
        prefetch.start_log_probs(cfg, 2, _rollout(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet")
        assert prefetch.take_log_probs(cfg, *other) is None
        assert (
            prefetch.take_log_probs(cfg, 2, _rollout(), WeightsRef(version=2, sha256="w"), "/run/lp.parquet")
            is None
        )

    asyncio.run(go())


def test_a_trainer_error_surfaces_in_the_log_prob_taker(monkeypatch):
    cfg, weights, order = RunConfig(), WeightsRef(version=0, sha256="w"), []
    monkeypatch.setattr(actors, "engines", lambda cfg: [])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [_Trainer(0, order, fail=True)])

    async def go():
        prefetch.start_log_probs(cfg, 0, _rollout(), weights, "/run/lp.parquet")
        answers = prefetch.take_log_probs(cfg, 0, _rollout(), weights, "/run/lp.parquet")
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
    stages.start_log_prob(cfg, 1, _rollout(), WeightsRef(version=1, sha256="w"))
    assert started == []
    stages.start_log_prob(RunConfig(), 1, _rollout(), WeightsRef(version=1, sha256="w"))
    assert len(started) == 1


def test_what_waits_for_a_stage_runs_once_for_that_stage_and_rollout_only():
    cfg, calls = RunConfig(), []
    prefetch.when(cfg, "generate", 3, calls.append)
    prefetch.done(cfg, "generate", 4, _rollout("4"))  # another rollout: not this callback's
    prefetch.done(cfg, "log-prob", 3, _rollout("3"))  # another stage
    prefetch.done(cfg, "generate", 3, _rollout("3"))
    # the flow's call after the task returned (a cached task writes nothing) finds the callback gone
    prefetch.done(cfg, "generate", 3, _rollout("3"))
    assert calls == [_rollout("3")]
    prefetch.when(cfg, "generate", 6, calls.append)
    prefetch.drop()  # the run ended: nothing waits any more
    prefetch.done(cfg, "generate", 6, _rollout("6"))
    assert calls == [_rollout("3")]


class _Learner(_Trainer):
    """A trainer rank that also trains (`fail_first`: its first attempt raises) and writes its step-boundary
    snapshot at the end of the step or when asked (`snapshots`: the rollouts it wrote)."""

    def __init__(self, rank: int, order: list[str], fail_first: bool = False) -> None:
        super().__init__(rank, order)
        self.applied, self.snapshots = -1, []

        async def write_snapshot():
            if self.applied >= 0 and self.applied not in self.snapshots:
                order.append(f"snapshot {rank} of {self.applied}")
                self.snapshots.append(self.applied)
            return self.applied

        async def train_step(rollout, logprobs, dump, ctx, snapshot=True):
            order.append(f"train {rank} on {logprobs.sha256[0]} attempt {ctx['attempt']}")
            if fail_first and ctx["attempt"] == 0:
                raise RuntimeError("train fault")
            self.applied = ctx["rollout_id"]
            if snapshot:
                await write_snapshot()
            return [{"train/step": 1.0, "train/loss": 0.5}]

        async def perf():
            return {"perf/train_time": 0.1}

        async def health():
            return {"rank": rank, "last_applied_rollout": self.applied}

        self.train_step, self.perf = _Method(train_step), _Method(perf)
        self.write_snapshot, self.health = _Method(write_snapshot), _Method(health)


class _Engines(_Releasing):
    def __init__(self, order: list[str]) -> None:
        super().__init__(order)

        async def resume_memory(*after):
            order.append("resume")

        async def snapshot_and_scramble():
            order.append("scramble")

        async def tensor_hashes():
            return {}

        self.resume_memory, self.snapshot_and_scramble = (
            _Method(resume_memory),
            _Method(snapshot_and_scramble),
        )
        self.tensor_hashes = _Method(tensor_hashes)


class _Transfer:
    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def push(self, cfg, engines, version, ctx):
        self.order.append(f"push v{version} attempt {ctx['attempt']}")
        return Pushed(sha256="pushed", tensor_hashes={})


@pytest.fixture
def learners(monkeypatch):
    order: list[str] = []
    engine = _Engines(order)
    trainers = [_Learner(0, order), _Learner(1, order)]
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: _Transfer(order))
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    yield order, trainers, engine
    prefetch.drop()


def test_the_train_step_starts_once_log_prob_is_done_and_the_sync_once_train_step_is_done(learners):
    order, trainers, engine = learners
    cfg, weights, table = RunConfig(), WeightsRef(version=2, sha256="w"), _rollout("c")

    async def go():
        stages.start_log_prob(cfg, 2, _rollout(), weights)
        assert [len(t.train_step.calls) for t in trainers] == [0, 0]  # not before log-prob is done
        prefetch.done(cfg, "log-prob", 2, LogProbs(table=table, stats={}))
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]  # submitted at once
        steps = await stages.train_step.fn(cfg, 2, _rollout(), table, "session")
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
        stages.start_train_step(cfg, 2, _rollout(), _rollout("a"))
        await stages.train_step.fn(cfg, 2, _rollout(), _rollout("b"), "session")

    asyncio.run(go())
    assert [len(t.train_step.calls) for t in trainers] == [2, 2]  # the task asked again, with its own table
    assert "train 0 on b attempt 0" in order


def test_a_sync_is_started_only_for_a_run_whose_engines_take_the_weights(learners):
    _, _, engine = learners
    skip = RunConfig.model_validate({"debug": {"debug_skip_weight_update": True}})

    async def go():
        for cfg in (skip, RunConfig()):
            stages.start_train_step(cfg, 1, _rollout(), _rollout("c"))
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


def _one() -> list[list[GenerateRequest]]:
    """The parts of a run with one engine."""
    return _parts()[:1]


@pytest.fixture
def chain(monkeypatch):
    order: list[str] = []
    engine = _Engine()
    engine.release_memory = _Releasing(order).release_memory
    trainers = [_Trainer(0, order), _Trainer(1, order)]
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    yield order, engine, trainers
    prefetch.drop()


def test_a_chained_log_prob_pass_follows_the_written_file_and_the_log_prob_stage_takes_it(chain):
    order, engine, trainers = chain
    cfg, weights, out = RunConfig(), WeightsRef(version=3, sha256="sha"), "/run/lp.parquet"

    async def go():
        _start(cfg, parts=_one(), log_probs_out=out)
        # every call goes out at once: the trainers' passes wait for the file's ref and the engines' release
        assert [len(m.calls) for m in (engine.release_memory, *[t.compute_log_probs for t in trainers])] == [
            1,
            1,
            1,
        ]
        answers = prefetch.take(cfg, 3, (3, "sha"), _one(), _PATH)
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
        {"rollout": _rollout("9")},  # generate wrote another file (a retry, a cached task)
        {"weights": WeightsRef(version=3, sha256="other")},
        {"out": "/run/other.parquet"},
    ],
)
def test_a_chained_log_prob_pass_for_anything_else_is_dropped_and_the_pass_asked_afresh(chain, other):
    order, engine, trainers = chain
    cfg = RunConfig()

    async def go():
        _start(cfg, parts=_one(), log_probs_out="/run/lp.parquet")
        generated = await prefetch.take(cfg, 3, (3, "sha"), _one(), _PATH)  # type: ignore[misc]
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
    engine = _Engine(fail=True)
    engine.release_memory = _Releasing(order).release_memory
    trainer = _Trainer(0, order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [trainer])
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")

    async def go():
        _start(cfg, parts=_one(), log_probs_out="/run/lp.parquet")
        answers = prefetch.take(cfg, 3, (3, "sha"), _one(), _PATH)
        with pytest.raises(RuntimeError, match="engine fault"):
            await answers  # type: ignore[misc]
        prefetch.start_log_probs(cfg, 3, _rollout(), weights, "/run/lp.parquet")  # the retry's file
        taken = prefetch.take_log_probs(cfg, 3, _rollout(), weights, "/run/lp.parquet")
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


def test_engines_asked_ahead_are_scored_and_written_by_the_start_for_the_same_rollout(engines, finisher):
    cfg = RunConfig()

    async def go():
        prefetch.ask_engines(cfg, 3, (3, "sha"), _parts())
        assert (
            len(engines[0].generate.calls) == 1 and finisher.finish_rollout.calls == []
        )  # nothing written yet
        _start(cfg)
        generated = await prefetch.take(cfg, 3, (3, "sha"), _parts(), _PATH)  # type: ignore[misc]
        assert generated.rollout.path == _PATH

    asyncio.run(go())
    assert engines[0].generate.calls == [(_parts()[0], {"rollout_id": 3, "attempt": 0})]  # asked once
    ((*_, answer),) = finisher.finish_rollout.calls
    assert answer.result() == ["out-0", "out-1"]


@pytest.mark.parametrize(
    "other",
    [
        (4, (3, "sha"), _parts()),  # another rollout
        (3, (3, "other"), _parts()),  # other weights
        (3, (3, "sha"), [[GenerateRequest(prompt_tokens=(1, 2), seed=9)], []]),  # other requests
    ],
)
def test_engines_asked_ahead_for_anything_else_are_dropped_and_asked_afresh(engines, finisher, other):
    cfg = RunConfig()

    async def go():
        prefetch.ask_engines(cfg, *other)
        _start(cfg)
        await prefetch.take(cfg, 3, (3, "sha"), _parts(), _PATH)  # type: ignore[misc]

    asyncio.run(go())
    assert engines[0].generate.calls[-1] == (_parts()[0], {"rollout_id": 3, "attempt": 0})
    assert len(engines[0].generate.calls) == 2


class _Held(_Engine):
    """An engine that logs its calls in the order it runs them and holds version 3."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        generate = self.generate.fn

        async def logged_generate(part, ctx):
            order.append(f"generate {ctx['rollout_id']}")
            return await generate(part, ctx)

        async def weight_version():
            order.append("weight_version")
            return 3

        async def weights_sha256():
            order.append("weights_sha256")
            return "pushed"

        self.generate = _Method(logged_generate)
        self.weight_version, self.weights_sha256 = _Method(weight_version), _Method(weights_sha256)


def test_after_the_sync_the_checks_questions_then_the_next_generation_go_to_the_engines(
    monkeypatch, finisher
):
    order: list[str] = []
    engine = _Held(order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="pushed")

    async def go():
        stages.ask_engines_after_sync(cfg, 2)
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
    stages.ask_engines_after_sync(cfg, 2)
    prefetch.done(cfg, "sync", 2, WeightsRef(version=3, sha256="w"))
    assert asked == []


class _Chained(_Transfer, FullTransfer):
    """A transfer whose calls can be submitted ahead: each rank exports after the calls submitted to it before (its
    train step, as Ray keeps one caller's calls in order), and raises unless it applied rollout `applied`; then the
    engines load (`fail_load`: the first load raises)."""

    def __init__(self, order: list[str], fail_load: bool = False) -> None:
        super().__init__(order)
        self.fail_load, self.submitted = fail_load, 0

    def submit(self, cfg, engines, version, ctx, applied=None):
        self.submitted += 1
        trainers = actors.trainers(cfg)
        before = [t.train_step.answers[-1] for t in trainers if t.train_step.answers]

        async def pushed():
            await asyncio.gather(*before, return_exceptions=True)
            if applied is not None and any(t.applied != applied for t in trainers):
                raise RuntimeError("the step was not applied: nothing exported")
            self.order.append(f"export v{version} attempt {ctx['attempt']}")
            if self.fail_load:
                self.fail_load = False
                raise RuntimeError("engine load fault")
            return Pushed(sha256="pushed", tensor_hashes={})

        return asyncio.ensure_future(pushed())


class _Synced(_Engines, _Held):
    """An engine that resumes, loads and answers the check's questions and generates."""

    def __init__(self, order: list[str]) -> None:
        _Held.__init__(self, order)
        _Engines.__init__(self, order)


def _attempt(monkeypatch, n: int) -> None:
    """The stage tasks called from now on run as attempt `n` (a Prefect retry)."""
    monkeypatch.setattr(stages, "_ctx", lambda rollout_id: {"rollout_id": rollout_id, "attempt": n})


@pytest.fixture
def chained(monkeypatch, finisher):
    order: list[str] = []
    engine, trainers = _Synced(order), [_Learner(0, order), _Learner(1, order)]
    transfer = _Chained(order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: transfer)
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    yield order, engine, trainers, transfer
    prefetch.drop()


@pytest.mark.parametrize("colocate", [False, True])
def test_a_sync_chained_on_the_train_step_goes_out_with_it_and_the_sync_task_takes_it(chained, colocate):
    order, engine, trainers, transfer = chained
    cfg, table = RunConfig.model_validate({"placement": {"colocate": colocate}}), _rollout("c")
    submitted_before = []  # how many transfers were submitted when each rank's snapshot was asked for
    for t in trainers:
        ask = t.write_snapshot.remote
        t.write_snapshot.remote = lambda *a, ask=ask: (submitted_before.append(transfer.submitted), ask(*a))[
            1
        ]

    async def go():
        stages.start_train_step(cfg, 2, _rollout(), table)
        # the engines' resume and the transfer are submitted with the step; the export runs behind every rank's
        # step, and colocated engines take their memory back only once the step is done
        assert [len(t.train_step.calls) for t in trainers] == [1, 1] and transfer.submitted == 1
        ((*steps,),) = engine.resume_memory.calls
        assert len(steps) == (2 if colocate else 0)
        await stages.train_step.fn(cfg, 2, _rollout(), table, "session")
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
        stages.start_train_step(RunConfig(), 2, _rollout(), _rollout("c"))
        await stages.train_step.fn(RunConfig(), 2, _rollout(), _rollout("c"), "session")
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
    _attempt(monkeypatch, 1)
    cfg = RunConfig()

    async def go():
        return await stages.sync.fn(cfg, 2, rollout=_rollout(), logprobs=_rollout("c"))

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
    trainers = [_Learner(0, order), _Learner(1, order, fail_first=True)]
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    cfg, table = RunConfig(), _rollout("c")

    async def go():
        stages.start_train_step(cfg, 2, _rollout(), table)
        with pytest.raises(RuntimeError, match="train fault"):
            await stages.train_step.fn(cfg, 2, _rollout(), table, "session")
        _attempt(monkeypatch, 1)
        await stages.train_step.fn(cfg, 2, _rollout(), table, "session")  # the retry: its own calls
        _attempt(monkeypatch, 0)  # the sync task's first attempt
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


def test_the_next_rollouts_calls_go_out_behind_a_chained_sync_and_are_taken_once_it_synced(chained):
    order, engine, _, transfer = chained
    cfg, table = RunConfig(), _rollout("c")

    async def go():
        stages.ask_engines_after_sync(cfg, 2)  # the parent, before rollout 2's flow run
        stages.start_train_step(cfg, 2, _rollout(), table)
        # the check's questions and rollout 3's generation are submitted with the step, behind the transfer
        assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256, engine.generate)] == [
            1,
            1,
            1,
        ]
        await stages.train_step.fn(cfg, 2, _rollout(), table, "session")
        weights = await stages.sync.fn(cfg, 2)
        assert (await stages.check.fn(cfg, 2, [], weights))["check/engines_in_sync"] == 1.0
        stages.start_next_generation(cfg, 3, weights, log_probs=False)
        path = str(stages._paths(cfg).rollout(3))
        parts = [[GenerateRequest(prompt_tokens=(1,), seed=0)]]
        generated = await prefetch.take(cfg, 3, (3, "pushed"), parts, path)  # type: ignore[misc]
        assert generated.rollout.path == path

    asyncio.run(go())
    # asked once each: the sync, the check and the generation took the chained calls
    assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256, engine.generate)] == [
        1,
        1,
        1,
    ]
    assert transfer.submitted == 1 and not any(o.startswith("push") for o in order)


def test_after_a_chained_sync_that_failed_the_next_rollouts_calls_are_asked_afresh(chained, monkeypatch):
    order, engine, _, transfer = chained
    transfer.fail_load = True
    cfg, table = RunConfig(), _rollout("c")

    async def go():
        stages.ask_engines_after_sync(cfg, 2)
        stages.start_train_step(cfg, 2, _rollout(), table)
        await stages.train_step.fn(cfg, 2, _rollout(), table, "session")
        with pytest.raises(RuntimeError, match="engine load fault"):
            await stages.sync.fn(cfg, 2)
        _attempt(monkeypatch, 1)
        weights = await stages.sync.fn(cfg, 2)  # the retry pushes itself; then the calls are asked again
        assert (await stages.check.fn(cfg, 2, [], weights))["check/engines_in_sync"] == 1.0

    asyncio.run(go())
    assert order.count("push v3 attempt 1") == 1
    # the chained questions and generation, then the ones asked after the retried sync
    assert [len(m.calls) for m in (engine.weight_version, engine.weights_sha256, engine.generate)] == [
        2,
        2,
        2,
    ]


def _learning_chain(monkeypatch, finisher):
    """One engine and two trainer ranks that pass, train and answer; rollout 3's requests are `_one()`'s."""
    order: list[str] = []
    engine = _Synced(order)
    trainers = [_Learner(0, order), _Learner(1, order)]
    for rank, trainer in enumerate(trainers):  # the pass writes a table and answers its stats

        async def compute_log_probs(rollout, out, *after, rank=rank):
            order.append(f"log-probs {rank} on {rollout.sha256[0]}")
            return ArtifactRef(path=out, sha256="e" * 64, rows=2, schema_version=1, kind="logprobs")

        async def rollout_stats(rollout, written):
            order.append("stats")
            return {"rollout/log_probs": -1.0}

        trainer.compute_log_probs, trainer.rollout_stats = _Method(compute_log_probs), _Method(rollout_stats)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: _Transfer(order))
    entry = type("E", (), {"group_index": 0, "request": _one()[0][0]})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    return order, trainers


_ASKED = [[_one()[0][0]]]  # the one engine's part of `_learning_chain`'s rollout


def test_the_parents_chain_trains_behind_the_log_prob_pass_and_the_train_step_task_takes_it(
    monkeypatch, finisher
):
    order, trainers = _learning_chain(monkeypatch, finisher)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")
    path = str(stages._paths(cfg).rollout(3))

    async def go():
        stages.start_next_generation(cfg, 3, weights)
        # the pass and the train step behind it are submitted with the generation
        assert [len(t.train_step.calls) for t in trainers] == [1, 1]
        generated = await prefetch.take(cfg, 3, (3, "sha"), _ASKED, path)  # type: ignore[misc]
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
    _, trainers = _learning_chain(monkeypatch, finisher)
    cfg, weights = RunConfig(), WeightsRef(version=3, sha256="sha")

    async def go():
        stages.start_next_generation(cfg, 3, weights)
        await prefetch.take(cfg, 3, (3, "sha"), _ASKED, str(stages._paths(cfg).rollout(3)))  # type: ignore[misc]
        # generate's task wrote another file (a retry): the log-prob task and the train step ask afresh
        stages.start_log_prob(cfg, 3, _rollout("9"), weights)
        logprobs = await stages.log_prob.fn(cfg, 3, _rollout("9"), weights)
        await stages.train_step.fn(cfg, 3, _rollout("9"), logprobs.table, "session")

    asyncio.run(go())
    assert [len(t.train_step.calls) for t in trainers] == [2, 2]
    assert trainers[0].train_step.calls[-1][0] == _rollout("9")
