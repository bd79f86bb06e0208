"""The Ray actor that hosts one trainer rank of any backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch

from artifacts.hashing import tensor_hashes
from artifacts.store import ArtifactRef
from artifacts.wire import WireFile, WireWeights, to_wire, write_file
from faults import FaultHookRequest, FaultInjector
from procs import freeze_heap, memory_gib, preload_arrow, trim_heap
from trainers.base import Trainer
from trainers.collectives import use_interface_for
from trainers.registry import get_trainer_class
from trainers.settings import TrainerSettings

SNAPSHOT_DIR = "ft/trainer"  # under the run dir: the step-boundary snapshots a restarted trainer resumes from


def snapshot_dir(run_dir: str | Path) -> Path:
    """Where the trainers keep their step-boundary snapshots (rank 0 writes, every rank reads)."""
    return Path(run_dir) / SNAPSHOT_DIR


def advance_rng() -> None:
    """Re-seed torch's generators on every device at random: a forward that then computes otherwise depends on the
    RNG (dropout), which a replay in a fresh, identically seeded process cannot show."""
    torch.seed()


@ray.remote(num_cpus=0)
class TrainerActor:
    """One data-parallel rank; every method forwards to the backend's trainer.

    At the end of every rollout it trains, rank 0 writes a step-boundary snapshot (weights, optimizer, schedule,
    RNG, the applied metrics) under the run dir, so that a trainer that dies can be re-created and resume exactly
    where the last completed train-step left it (tasks/recovery.py)."""

    def __init__(
        self,
        backend: str,
        settings: TrainerSettings,
        checkpoint: str,
        rank: int,
        world_size: int,
        faults: list[FaultHookRequest] | None = None,
        epoch: float | None = None,
        run_id: str = "",
    ) -> None:
        torch.set_num_threads(settings.num_threads)
        self.trainer: Trainer = get_trainer_class(backend)(settings, checkpoint, rank, world_size)
        # written into checkpoints: a relaunch with --load of one resumes this run
        self.trainer.run_id = run_id
        self.faults = FaultInjector(faults or [], "trainer", rank, settings.run_dir, epoch)
        self.trainer.faults = self.faults
        self.snapshots = snapshot_dir(settings.run_dir)
        self.snapshot_of = -1  # the rollout whose step-boundary snapshot is written (-1: none)
        # streamed buckets are hashed as the engines hold them (bfloat16 in a bf16 run), like tensor_hashes
        self._held_as = torch.bfloat16 if settings.precision == "bf16" else None
        self.train_calls = 0

    def node(self) -> tuple[str, str]:
        """(Ray node id, node IP) of this rank: where the rendezvous of the trainer group goes is decided from
        every rank's answer (trainers/collectives.rendezvous_host)."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self, host: str = "127.0.0.1") -> int:
        """A port free on `host` of this node now (rank 0's: the rendezvous listens there)."""
        import socket

        with socket.socket() as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the trainer group at `master_addr:master_port` (gloo on this node's interface when the group
        spans nodes) and build the backend's model and optimizer."""
        use_interface_for(master_addr, ray.util.get_node_ip_address())
        info = self.trainer.setup(master_addr, master_port)
        preload_arrow()
        freeze_heap()  # the model, optimizer and imports live as long as the actor
        return info

    def compute_log_probs(
        self, rollout_ref: ArtifactRef, out_path: str, ctx: dict[str, Any] | None = None
    ) -> ArtifactRef | None:
        """The backend's log-prob pass; trainers.base.AlreadyApplied, with `out_path` untouched, for a rollout whose
        step this trainer applied. `ctx`: the stage's (rollout_id, attempt, stage), for the fault hooks."""
        self.faults.set_context(**(ctx or {}))
        return self.trainer.compute_log_probs(rollout_ref, out_path)

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        return self.trainer.rollout_stats(rollout_ref, logprob_ref)

    def train_step(
        self,
        rollout_ref: ArtifactRef,
        logprob_ref: ArtifactRef,
        dump_template: str | None = None,
        ctx: dict[str, Any] | None = None,
    ) -> list[dict[str, float]]:
        """The backend's train_step, then the step-boundary snapshot of what it applied; a step never starts
        before the snapshot of the one before is written."""
        self.faults.set_context(**(ctx or {}))
        self.train_calls += 1
        self.write_snapshot()
        steps = self.trainer.train_step(rollout_ref, logprob_ref, dump_template)
        self.write_snapshot()
        trim_heap()  # the step's gradients and activations are freed: give their pages back while the engines work
        return steps

    def write_snapshot(self) -> int:
        """Write the step-boundary snapshot of the last applied rollout unless it is written already (every rank
        takes part: a sharded backend gathers); returns that rollout's id (-1: nothing applied yet)."""
        applied = self.trainer.last_applied_rollout
        if applied >= 0 and applied != self.snapshot_of:
            self.trainer.save(str(self.snapshots), applied, snapshot=True)
            self.snapshot_of = applied
        if applied >= 0:  # a failed step can be put back from it (CheckpointState._boundary_on_disk)
            self.trainer.boundary_dir = str(self.snapshots)
        return applied

    def perf(self) -> dict[str, float]:
        return self.trainer.perf()

    def memory(self) -> dict[str, float]:
        """This process's resident memory now and at its peak, GiB (procs.memory_gib)."""
        return memory_gib()

    def stream_weights(
        self, bucket_bytes: int, ctx: dict[str, Any] | None = None, files: str | None = None
    ) -> Iterator[WireWeights | WireFile]:
        """The backend's `iter_weights` as a Ray streaming generator (call it with num_returns="streaming"): rank
        0's buckets, cast to the engines' dtype, go to the engines one by one (tasks/transfer.StreamedTransfer);
        their tensor hashes are kept for `stream_summary`. `files`: a directory on the engines' machine, where
        bucket i is written as `i.bin` and only its WireFile travels (the object store then never holds it)."""
        self.faults.reach("trainer_export_weights_before_send", **(ctx or {}))
        self._streamed: dict[str, str] = {}
        # cast as each tensor is copied, as the engines hold them: half the bytes in bf16
        for i, bucket in enumerate(self.trainer.iter_weights(bucket_bytes, self._held_as)):
            self._streamed.update(tensor_hashes(bucket))
            yield to_wire(bucket) if files is None else write_file(bucket, Path(files) / f"{i}.bin")

    def stream_summary(self) -> dict[str, Any]:
        """What the last `stream_weights` sent: the weight names and their per-tensor hashes."""
        return {"names": sorted(self._streamed), "tensor_hashes": dict(self._streamed)}

    def export_weights(
        self, ctx: dict[str, Any] | None = None, applied: int | None = None, for_engines: bool = True
    ) -> WireWeights:
        """The trainer's weights as numpy arrays (artifacts.wire): zero-copy in Ray's object store. `applied`: the
        rollout whose step these weights must hold (a sync submitted behind that step: if the step failed, this
        raises and nothing reaches the engines). `for_engines`: in the engines' dtype (bfloat16 in a bf16 run:
        half the bytes to move), else the float32 master weights."""
        if applied is not None and self.trainer.last_applied_rollout != applied:
            raise RuntimeError(
                f"weights after rollout {applied}'s train step asked for, but the trainer is at rollout "
                f"{self.trainer.last_applied_rollout} (that step failed): nothing exported"
            )
        self.faults.reach("trainer_export_weights_before_send", **(ctx or {}))
        return to_wire(self.trainer.export_weights(self._held_as if for_engines else None))

    def weights_sha256(self) -> str:
        return self.trainer.weights_sha256()

    def model_hash(self) -> dict[str, str]:
        return self.trainer.model_hash()

    def reference_and_start_sha256(self) -> dict[str, str]:
        return self.trainer.reference_and_start_sha256()

    def advance_rng(self) -> None:
        advance_rng()

    def tensor_hashes(self) -> dict[str, str]:
        return self.trainer.tensor_hashes()

    def save(self, directory: str, rollout_id: int, ctx: dict[str, Any] | None = None) -> None:
        self.faults.set_context(**(ctx or {}))
        self.trainer.save(directory, rollout_id)

    def load(self, directory: str) -> int:
        self.snapshot_of = self.trainer.load(directory)  # what it restored is on disk already
        return self.snapshot_of

    def health(self) -> dict[str, Any]:
        """Answers while the actor is alive and not stuck in a call (tasks/recovery.py)."""
        return {"rank": self.trainer.rank, "last_applied_rollout": self.trainer.last_applied_rollout}

    def stats(self) -> dict[str, Any]:
        return {"train_calls": self.train_calls, "last_applied_rollout": self.trainer.last_applied_rollout}
