"""The Ray actor that hosts one trainer rank of any backend."""

from __future__ import annotations

from typing import Any

import ray
import torch

from artifacts.store import ArtifactRef
from artifacts.wire import WireWeights, to_wire
from flows.config import RunConfig
from trainers.registry import get_trainer_class


@ray.remote(num_cpus=0)
class TrainerActor:
    """One data-parallel rank; every method forwards to the backend's trainer."""

    def __init__(self, cfg: RunConfig, checkpoint: str, rank: int, world_size: int) -> None:
        torch.set_num_threads(cfg.num_threads)
        self.trainer = get_trainer_class(cfg.train.train_backend)(cfg, checkpoint, rank, world_size)
        self.train_calls = 0

    def free_port(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        return self.trainer.setup(master_addr, master_port)

    def compute_log_probs(self, rollout_ref: ArtifactRef, out_path: str) -> ArtifactRef | None:
        return self.trainer.compute_log_probs(rollout_ref, out_path)

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        return self.trainer.rollout_stats(rollout_ref, logprob_ref)

    def train_step(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef,
                   dump_template: str | None = None) -> list[dict[str, float]]:
        self.train_calls += 1
        return self.trainer.train_step(rollout_ref, logprob_ref, dump_template)

    def perf(self) -> dict[str, float]:
        return self.trainer.perf()

    def export_weights(self) -> WireWeights:
        """The trainer's weights as numpy arrays (artifacts.wire): zero-copy in Ray's object store."""
        return to_wire(self.trainer.export_weights())

    def weights_sha256(self) -> str:
        return self.trainer.weights_sha256()

    def model_hash(self) -> dict[str, str]:
        return self.trainer.model_hash()

    def save(self, directory: str, rollout_id: int) -> None:
        self.trainer.save(directory, rollout_id)

    def load(self, directory: str) -> int:
        return self.trainer.load(directory)

    def stats(self) -> dict[str, Any]:
        return {"train_calls": self.train_calls, "last_applied_rollout": self.trainer.last_applied_rollout}
