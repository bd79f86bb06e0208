"""Fake actors for the prefetch tests: each method runs as Ray runs an actor call (after the object refs among its
arguments, here futures), and logs what it did to an `order` list the tests compare."""

from __future__ import annotations

import asyncio

from artifacts.store import ArtifactRef
from engines.base import GenerateRequest
from rollout.finish import Tally
from tasks import actors, prefetch, stages
from tasks.transfer import FullTransfer, Pushed


class Method:
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


class Engine:
    """generate answers `out-<seed>` per request."""

    def __init__(self, fail: bool = False) -> None:
        async def generate(part, ctx):
            await asyncio.sleep(0)
            if fail:
                raise RuntimeError("engine fault")
            return [f"out-{r.seed}" for r in part]

        self.generate = Method(generate)


class Finisher:
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

        self.finish_rollout = Method(finish_rollout, num_returns=2)


def _sha(answers) -> str:
    return (str(len(answers)) * 64)[:64]


def two_engine_parts() -> list[list[GenerateRequest]]:
    return [[GenerateRequest(prompt_tokens=(1, 2), seed=s) for s in (0, 1)], []]


ENTRIES = [
    "entry-0",
    "entry-1",
]  # what the rollout actor scores the answers with: passed through as they are
ROLLOUT_PATH = "/run/rollouts/rollout_000003.parquet"


def start_generation(
    cfg, rollout_id=3, weights=(3, "sha"), parts=None, path=ROLLOUT_PATH, log_probs_out=None
):
    prefetch.start(cfg, rollout_id, weights, ENTRIES, parts or two_engine_parts(), path, log_probs_out)


class Trainer:
    def __init__(self, rank: int, order: list[str], fail: bool = False) -> None:
        async def compute_log_probs(rollout, out, *after):
            order.append(f"log-probs {rank} after {len(after)}")
            if fail:
                raise RuntimeError("trainer fault")
            return f"{out}@{rollout.sha256}" if rank == 0 else None

        async def rollout_stats(rollout, written):
            order.append("stats")
            return {"written": written}

        self.compute_log_probs, self.rollout_stats = Method(compute_log_probs), Method(rollout_stats)


class Releasing:
    def __init__(self, order: list[str]) -> None:
        async def release_memory():
            await asyncio.sleep(0.01)  # the trainers must wait for it
            order.append("release")

        self.release_memory = Method(release_memory)


def rollout_ref(sha: str = "1") -> ArtifactRef:
    return ArtifactRef(path="/run/rollout.parquet", sha256=sha * 64, rows=2, schema_version=1, kind="rollout")


class Learner(Trainer):
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

        self.train_step, self.perf = Method(train_step), Method(perf)
        self.write_snapshot, self.health = Method(write_snapshot), Method(health)


class Engines(Releasing):
    def __init__(self, order: list[str]) -> None:
        super().__init__(order)

        async def resume_memory(*after):
            order.append("resume")

        async def snapshot_and_scramble():
            order.append("scramble")

        async def tensor_hashes():
            return {}

        self.resume_memory, self.snapshot_and_scramble = (
            Method(resume_memory),
            Method(snapshot_and_scramble),
        )
        self.tensor_hashes = Method(tensor_hashes)


class Transfer:
    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def push(self, cfg, engines, version, ctx):
        self.order.append(f"push v{version} attempt {ctx['attempt']}")
        return Pushed(sha256="pushed", tensor_hashes={})


def one_engine_parts() -> list[list[GenerateRequest]]:
    """The parts of a run with one engine."""
    return two_engine_parts()[:1]


class Held(Engine):
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

        self.generate = Method(logged_generate)
        self.weight_version, self.weights_sha256 = Method(weight_version), Method(weights_sha256)


class Chained(Transfer, FullTransfer):
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


class Synced(Engines, Held):
    """An engine that resumes, loads and answers the check's questions and generates."""

    def __init__(self, order: list[str]) -> None:
        Held.__init__(self, order)
        Engines.__init__(self, order)


def as_attempt(monkeypatch, n: int) -> None:
    """The stage tasks called from now on run as attempt `n` (a Prefect retry)."""
    monkeypatch.setattr(stages, "_ctx", lambda rollout_id: {"rollout_id": rollout_id, "attempt": n})


def learning_chain(monkeypatch, finisher):
    """One engine and two trainer ranks that pass, train and answer; rollout 3's requests are `one_engine_parts()`'s."""
    order: list[str] = []
    engine = Synced(order)
    trainers = [Learner(0, order), Learner(1, order)]
    for rank, trainer in enumerate(trainers):  # the pass writes a table and answers its stats

        async def compute_log_probs(rollout, out, *after, rank=rank):
            order.append(f"log-probs {rank} on {rollout.sha256[0]}")
            return ArtifactRef(path=out, sha256="e" * 64, rows=2, schema_version=1, kind="logprobs")

        async def rollout_stats(rollout, written):
            order.append("stats")
            return {"rollout/log_probs": -1.0}

        trainer.compute_log_probs, trainer.rollout_stats = Method(compute_log_probs), Method(rollout_stats)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: Transfer(order))
    entry = type("E", (), {"group_index": 0, "request": one_engine_parts()[0][0]})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    return order, trainers


ASKED = [[one_engine_parts()[0][0]]]  # the one engine's part of `learning_chain`'s rollout
