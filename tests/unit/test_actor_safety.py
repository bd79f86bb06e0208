"""The checks that make a retried stage safe live in the actors (DESIGN.md section 2): an engine refuses a
generation for another weight version, the rollout actor refuses outputs of other weights, a trainer refuses a
log-prob pass for a rollout whose step it applied. The actor classes run in-process here, without Ray."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket

import pytest
import torch

import engines.actor
from artifacts.store import read_table, write_rollout
from config import RunConfig
from config.stages import STAGES, stage_end_hook
from engines.actor import EngineActor
from engines.base import EngineAnswer, GenerateOutput, StaleWeights
from faults import HOOKS, FaultInjector, FiredFault, parse_requests
from flows.resolve import resolve
from rollout.actor import RolloutActor
from rollout.data import prompts_for_rollout
from rollout.finish import check_versions, finish_rollout, in_entry_order
from rollout.requests import build_requests, split_for_engines, to_samples
from rollout.source import train_params
from trainers.actor import TrainerActor
from trainers.base import AlreadyApplied
from trainers.settings import trainer_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine_actor(base_checkpoint):
    """Engine 0 as its Ray actor class would build it (the heap freeze, for a long-lived actor, left out)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engines.actor, "freeze_heap", lambda: None)
        return EngineActor.__ray_actor_class__("torch", base_checkpoint, torch.get_num_threads(), 0)


@pytest.fixture(scope="module")
def rollout3(base_checkpoint, tmp_path_factory):
    """A resolved config with two engines and rollout 3's entries (16 samples: 4 prompts x 4)."""
    cfg, src = resolve(
        RunConfig.model_validate(
            {
                "hf_checkpoint": base_checkpoint,
                "run_dir": str(tmp_path_factory.mktemp("run")),
                "rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4, "rollout_num_engines": 2},
                "train": {"global_batch_size": 8, "micro_batch_size": 4, "lr": 1e-3},
            }
        )
    )
    r = cfg.rollout
    prompts = prompts_for_rollout(
        src.train.prompts, r.rollout_batch_size, 3, r.rollout_seed, cfg.data.rollout_shuffle
    )
    entries = build_requests(prompts, r.rollout_seed, 3, r.n_samples_per_prompt, train_params(cfg, src.stops))
    return cfg, src, entries


def _answers(engine_actor, entries, num_engines: int, version: int) -> list[EngineAnswer]:
    """What each engine answers for its non-empty part of `entries` on `version`."""
    parts = [p for p in split_for_engines(entries, num_engines) if p]
    return [engine_actor.generate([e.request for e in part], version) for part in parts]


def test_an_engine_refuses_a_generation_for_another_weight_version(engine_actor, rollout3):
    _, _, entries = rollout3
    requests = [e.request for e in entries[:2]]
    held, calls = engine_actor.weight_version(), engine_actor.generate_calls
    with pytest.raises(
        StaleWeights,
        match=rf"^rollout 3, eval: engine 0 holds weight version {held} but the call names version {held + 1}; "
        "refusing to generate on other weights$",
    ):
        engine_actor.generate(requests, held + 1, {"rollout_id": 3, "attempt": 1, "stage": "eval"})
    with pytest.raises(StaleWeights, match=r"^rollout 3, generate: engine 0 holds"):  # the stage by default
        engine_actor.generate(requests, held + 1, {"rollout_id": 3})
    assert engine_actor.generate_calls == calls  # nothing was generated

    answer = engine_actor.generate(requests, held, {"rollout_id": 3, "attempt": 0, "stage": "generate"})
    assert len(answer.outputs) == 2 and all(o.weight_version == held for o in answer.outputs)
    assert engine_actor.generate_calls == calls + 1


def test_the_generate_fault_hook_is_reached_before_the_version_check(engine_actor, rollout3):
    _, _, entries = rollout3
    (request,) = parse_requests(
        json.dumps({"request_id": "g", "hook_name": "engine_generate_start", "action": {"kind": "raise"}})
    )
    armed, engine_actor.faults = engine_actor.faults, FaultInjector([request], "engine", 0)
    try:
        held = engine_actor.weight_version()
        with pytest.raises(FiredFault, match="stage generate"):
            engine_actor.generate([entries[0].request], held + 1, {"rollout_id": 3, "stage": "generate"})
    finally:
        engine_actor.faults = armed


def _output(version: int) -> GenerateOutput:
    return GenerateOutput((5, 1), (-0.5, -0.25), "stop", version)


def test_check_versions_names_each_engine_whose_outputs_differ():
    check_versions({0: [_output(3)] * 2, 1: [_output(3)]}, 3, 5, "generate")  # all on version 3
    with pytest.raises(StaleWeights) as err:
        check_versions(
            {0: [_output(1), _output(3), _output(2)], 1: [_output(3)], 2: [_output(4)]}, 3, 5, "generate"
        )
    assert str(err.value) == (
        "rollout 5, generate: 2 of 3 outputs from engine 0 have weight version 1 / 2; 1 of 1 outputs from "
        "engine 2 have weight version 4, but the call names version 3; refusing to score and write outputs "
        "of other weights"
    )


def test_the_rollout_actor_refuses_outputs_of_other_weights_and_writes_nothing(
    engine_actor, rollout3, tmp_path
):
    cfg, _, entries = rollout3
    held = engine_actor.weight_version()
    answers = _answers(engine_actor, entries, 2, held)
    stale = list(answers)
    stale[1] = dataclasses.replace(
        answers[1],
        outputs=[dataclasses.replace(answers[1].outputs[0], weight_version=held + 7)]
        + answers[1].outputs[1:],
    )
    actor = RolloutActor.__ray_actor_class__(os.getcwd())
    try:
        path = tmp_path / "rollout_000003.parquet"
        ctx = {"rollout_id": 3, "attempt": 0, "stage": "generate"}
        n = len(answers[1].outputs)
        with pytest.raises(
            StaleWeights,
            match=rf"^rollout 3, generate: 1 of {n} outputs from engine 1 have weight version {held + 7}, but "
            rf"the call names version {held};",
        ):
            actor.finish_rollout(cfg, 3, entries, held, "w" * 64, str(path), *stale, ctx=ctx)
        with pytest.raises(StaleWeights, match=rf"^rollout 3, eval: .* names version {held + 1};"):
            actor.finish_rollout(
                cfg,
                3,
                entries,
                held + 1,
                "w" * 64,
                str(path),
                *answers,
                eval_mode=True,
                ctx={"rollout_id": 3},
            )
        assert not path.exists()

        ref, tally = actor.finish_rollout(cfg, 3, entries, held, "w" * 64, str(path), *answers, ctx=ctx)
        outputs = in_entry_order(entries, 2, [a.outputs for a in answers])
        expected, _ = asyncio.run(finish_rollout(cfg, 3, entries, outputs, "w" * 64, tmp_path / "x.parquet"))
        assert ref.sha256 == expected.sha256 and ref.rows == len(entries) and tally.tokens > 0
    finally:
        actor._loop.close()


def test_a_trainer_refuses_a_log_prob_pass_for_a_rollout_it_applied(engine_actor, rollout3, tmp_path):
    cfg, src, entries = rollout3
    outputs = engine_actor.engine.generate([e.request for e in entries])
    samples = asyncio.run(to_samples(entries, outputs, src.tokenizer, src.stops, src.scorer, 0))
    first = write_rollout(tmp_path / "rollout_0.parquet", samples)
    second = write_rollout(
        tmp_path / "rollout_1.parquet", [dataclasses.replace(s, rollout_id=1) for s in samples]
    )
    settings = trainer_settings(cfg.model_copy(update={"run_dir": str(tmp_path)}))
    actor = TrainerActor.__ray_actor_class__("torch", settings, cfg.hf_checkpoint, 0, 1)
    actor.trainer.setup("127.0.0.1", _free_port())

    lp_path = tmp_path / "logprobs_0.parquet"
    lp = actor.compute_log_probs(first, str(lp_path), {"rollout_id": 0, "attempt": 0, "stage": "log-prob"})
    actor.train_step(first, lp, None, {"rollout_id": 0, "attempt": 0, "stage": "train-step"})
    assert (tmp_path / "ft" / "trainer" / "iter_0000000").is_dir()  # the step-boundary snapshot, every step
    recorded = lp_path.read_bytes()

    ctx = {"rollout_id": 0, "attempt": 1, "stage": "log-prob"}
    with pytest.raises(
        AlreadyApplied,
        match=r"^rollout 0, log-prob: the trainer holds weight version 1 \(rollout 0's step applied\) but the "
        r"pass needs version 0;",
    ):
        actor.compute_log_probs(first, str(lp_path), ctx)
    assert lp_path.read_bytes() == recorded  # the table the step trained on stays as recorded
    assert actor.faults.context == ctx
    with pytest.raises(AlreadyApplied):
        actor.compute_log_probs(first, str(tmp_path / "elsewhere.parquet"))
    assert not (tmp_path / "elsewhere.parquet").exists()

    lp1 = actor.compute_log_probs(second, str(tmp_path / "logprobs_1.parquet"), {"rollout_id": 1})
    assert read_table(lp1).num_rows == len(samples)
    assert len(actor.train_step(second, lp1)) == 2 and actor.trainer.last_applied_rollout == 1
    assert (tmp_path / "ft" / "trainer" / "iter_0000001").is_dir()


def test_every_stage_has_an_end_hook_the_orchestrator_reaches(tmp_path):
    assert {stage_end_hook(s) for s in STAGES} <= {h for h, owner in HOOKS.items() if owner == "orchestrator"}
    assert "orchestrator_log_prob_end" in HOOKS and "orchestrator_train_step_end" in HOOKS
    text = json.dumps(
        {
            "request_id": "lp",
            "hook_name": "orchestrator_log_prob_end",
            "action": {"kind": "raise"},
            "rollout_id": 2,
        }
    )
    (request,) = parse_requests(text)
    assert request.owner == "orchestrator" and request.targets("orchestrator", None)
    assert RunConfig.model_validate({"faults": {"ci_fault_hooks": text}}).faults.requests() == [request]
    with pytest.raises(ValueError, match="reached by the orchestrator"):
        parse_requests(text.replace('"rollout_id"', '"target": {"engine": 0}, "rollout_id"'))

    injector = FaultInjector([request], "orchestrator", None, str(tmp_path))
    injector.set_context(rollout_id=1, attempt=0, stage="log-prob")
    injector.reach("orchestrator_log_prob_end")  # another rollout: the filter does not match
    injector.set_context(rollout_id=2)
    with pytest.raises(FiredFault, match="rollout_id 2 attempt 0 stage log-prob"):
        injector.reach("orchestrator_log_prob_end")
    lines = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [x["status"] for x in lines] == ["reached", "fired"]
    assert lines[-1]["context"] == {"rollout_id": 2, "attempt": 0, "stage": "log-prob"}
