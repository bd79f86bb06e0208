"""Fixtures of the prefetch tests: fake actors patched in where `tasks.actors` and `tasks.stages` find them, and
every head start dropped after each test."""

from __future__ import annotations

import pytest

from engines.base import GenerateRequest
from tasks import actors, prefetch, stages
from tests.unit.prefetch.fakes import (
    Chained,
    Engine,
    Engines,
    Finisher,
    Learner,
    Releasing,
    Synced,
    Trainer,
    Transfer,
)


@pytest.fixture(autouse=True)
def finisher(monkeypatch):
    finisher = Finisher()
    monkeypatch.setattr(actors, "rollout_actor", lambda cfg: finisher)
    return finisher


@pytest.fixture
def engines(monkeypatch):
    engines = [Engine(), Engine()]
    monkeypatch.setattr(actors, "engines", lambda cfg: engines)
    yield engines
    prefetch.drop()


@pytest.fixture
def log_prob_actors(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(actors, "engines", lambda cfg: [Releasing(order)])
    monkeypatch.setattr(actors, "trainers", lambda cfg: [Trainer(0, order), Trainer(1, order)])
    yield order
    prefetch.drop()


@pytest.fixture
def learners(monkeypatch):
    order: list[str] = []
    engine = Engines(order)
    trainers = [Learner(0, order), Learner(1, order)]
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: Transfer(order))
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    yield order, trainers, engine
    prefetch.drop()


@pytest.fixture
def chain(monkeypatch):
    order: list[str] = []
    engine = Engine()
    engine.release_memory = Releasing(order).release_memory
    trainers = [Trainer(0, order), Trainer(1, order)]
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    yield order, engine, trainers
    prefetch.drop()


@pytest.fixture
def chained(monkeypatch, finisher):
    order: list[str] = []
    engine, trainers = Synced(order), [Learner(0, order), Learner(1, order)]
    transfer = Chained(order)
    monkeypatch.setattr(actors, "engines", lambda cfg: [engine])
    monkeypatch.setattr(actors, "trainers", lambda cfg: trainers)
    monkeypatch.setattr(stages, "transfer_for", lambda cfg: transfer)
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    entry = type("E", (), {"group_index": 0, "request": GenerateRequest(prompt_tokens=(1,), seed=0)})()
    monkeypatch.setattr(stages, "train_requests", lambda cfg, rollout_id: [entry])
    yield order, engine, trainers, transfer
    prefetch.drop()


@pytest.fixture
def evals(monkeypatch):
    """An eval set of one request, scored by the fake rollout actor; the eval task's own
    reading and statistics stubbed. Yields its requests per engine, for one engine."""
    part = [GenerateRequest(prompt_tokens=(7,), seed=70)]
    entry = type("E", (), {"group_index": 0, "request": part[0]})()
    monkeypatch.setattr(stages, "eval_requests", lambda cfg, eval_id: [entry])
    monkeypatch.setattr(stages, "rollout_source", lambda cfg: type("S", (), {"evals": [("arith", None)]})())
    monkeypatch.setattr(stages, "read_rollout", lambda ref: [])
    monkeypatch.setattr(stages, "eval_stats", lambda samples, names: {"eval/arith": 1.0})
    monkeypatch.setattr(stages, "log_metrics", lambda *a, **k: None)
    yield [part]
    prefetch.drop()
