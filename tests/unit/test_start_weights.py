"""The trainer's evidence for "the reference is not the starting model" and for a forward that depends on the RNG,
in-process (no Ray): the recorded weight hashes, and a second log-prob pass after the RNG is moved on."""

from __future__ import annotations

import socket

import pytest
import torch

from artifacts.store import read_table
from config import RunConfig
from tests.unit.test_engine_trainer import _rollout
from trainers.settings import trainer_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def trainer_and_rollout(base_checkpoint, tmp_path_factory):
    from engines.torch_engine.engine import TorchEngine
    from trainers.torch_trainer.trainer import TorchTrainer

    tmp_path = tmp_path_factory.mktemp("start_weights")
    cfg = RunConfig.model_validate(
        {
            "hf_checkpoint": base_checkpoint,
            "run_dir": str(tmp_path),
            "rollout": {"rollout_batch_size": 2, "n_samples_per_prompt": 2},
            "train": {"global_batch_size": 4, "micro_batch_size": 4, "use_kl_loss": True},
        }
    )
    _, ref = _rollout(TorchEngine(base_checkpoint), cfg, tmp_path)
    trainer = TorchTrainer(trainer_settings(cfg), base_checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    return trainer, ref


def test_a_reference_loaded_from_other_weights_hashes_apart_from_the_start(trainer_and_rollout):
    trainer, _ = trainer_and_rollout
    same = trainer.reference_and_start_sha256()
    assert set(same) == {"start", "reference"} and same["start"] == same["reference"]
    with torch.no_grad():  # the planted fault: a reference that is not the starting model
        next(trainer.ref_model.parameters()).add_(1e-3)
    apart = trainer.reference_and_start_sha256()
    assert apart["start"] == same["start"] and apart["reference"] != same["reference"]


def test_a_forward_that_depends_on_the_rng_differs_on_a_second_pass_after_the_rng_moves_on(
    trainer_and_rollout, tmp_path, monkeypatch
):
    from trainers.actor import advance_rng

    trainer, ref = trainer_and_rollout
    clean = [read_table(trainer.compute_log_probs(ref, str(tmp_path / f"c{i}.parquet"))) for i in range(2)]
    assert clean[0].equals(clean[1])
    forward = trainer._token_outputs

    def seeded_dropout(model, mb):  # the planted fault: dropout on the forward, under the run's seed
        lp, ent = forward(model, mb)
        return torch.nn.functional.dropout(lp, p=0.5, training=True), ent

    monkeypatch.setattr(trainer, "_token_outputs", seeded_dropout)
    passes = []
    for i in range(
        2
    ):  # what a replay in a fresh process seeded as the run was sees: the same, a false all-clear
        torch.manual_seed(0)
        passes.append(read_table(trainer.compute_log_probs(ref, str(tmp_path / f"s{i}.parquet"))))
    assert passes[0].equals(passes[1])
    first = passes[1]
    advance_rng()
    second = read_table(trainer.compute_log_probs(ref, str(tmp_path / "d1.parquet")))
    assert first.column("log_probs") != second.column("log_probs")


def test_overwrite_removes_an_earlier_runs_start_weights(tmp_path):
    from artifacts import rundir
    from artifacts.store import RunPaths

    recorded = RunPaths(tmp_path).start_weights
    recorded.write_text('{"start": "a", "reference": "b", "rollout_id": 0}')
    rundir.clear(tmp_path)  # another run's hashes would name the wrong reference
    assert not recorded.exists()
