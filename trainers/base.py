"""The trainer interface: one instance per data-parallel rank, each in its own Ray actor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from artifacts.store import ArtifactRef
from faults import FaultInjector
from trainers.settings import TrainerSettings


class AlreadyApplied(RuntimeError):
    """A trainer refused a log-prob pass for a rollout whose step it has applied: its weights are no longer the
    ones that rollout's log-probs are computed on, and the table the step trained on must stay as recorded."""


class Trainer(Protocol):
    """What every training backend provides. Construct with `(settings, checkpoint, rank, world_size)`: the
    backend's flat section of the run config (trainers/settings.py), the HF model dir to start from, this
    rank and the world size (tensor x data parallel)."""

    rank: int
    last_applied_rollout: int  # the last rollout whose steps were applied (-1: none)
    applied: dict[int, list[dict[str, float]]]  # metrics of applied rollouts: the apply-once guard
    faults: FaultInjector  # armed by the actor with the run's fault hooks
    run_id: str  # the run it trains for, written into checkpoints
    # set by the actor: the step-boundary snapshot dir a failed step may be put back from (None: keep a copy in memory)
    boundary_dir: str | None

    def __init__(self, settings: TrainerSettings, checkpoint: str, rank: int, world_size: int) -> None: ...

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group and build model, reference model and optimizer; returns info."""
        ...

    def compute_log_probs(self, rollout_ref: ArtifactRef, out_path: str) -> ArtifactRef | None:
        """Old-policy (and reference) log-probs and entropy of every response token of the rollout.
        Every rank computes its share; rank 0 writes the Parquet at `out_path` and returns its ref.
        AlreadyApplied, with nothing computed or written, for a rollout at or before `last_applied_rollout`."""
        ...

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        """Trainer-side `rollout/*` stats (loss-mask means of log_probs, ref_log_probs, entropy and
        the engine's rollout_log_probs) of a rollout and its log-prob artifact."""
        ...

    def train_step(
        self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef, dump_template: str | None = None
    ) -> list[dict[str, float]]:
        """All optimizer steps of one rollout; one metrics dict per step (identical on every rank).
        Applying the same rollout twice is refused: a repeated call returns the first call's metrics.
        `dump_template` ({rollout_id}, {rank}) receives this rank's trained batch as Parquet."""
        ...

    def perf(self) -> dict[str, float]:
        """Seconds of the last rollout's stages on this rank: perf/log_probs_time, perf/ref_log_probs_time,
        perf/actor_train_time (slime's names)."""
        ...

    def iter_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Collective (every rank iterates it): the weights by HF name (what engines load) as CPU tensors in
        buckets of about `bucket_bytes` (counted in the bytes yielded), every weight once, on global rank 0; other
        ranks yield nothing. `dtype`: the floating ones cast to it as each is copied (one copy per tensor, already
        in `dtype`). A sharded backend gathers one tensor at a time: no rank holds two full copies."""
        ...

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Collective: every weight by HF name on global rank 0 ({} on other ranks), the floating ones cast to
        `dtype` when given (the engines' dtype: what a sync sends)."""
        ...

    def weights_sha256(self) -> str:
        """Collective: artifacts.hashing.weights_sha256 of the exported weights as the engines hold them (cast to
        bfloat16 in a bf16 run) on global rank 0 ("" elsewhere)."""
        ...

    def model_hash(self) -> dict[str, str]:
        """Per-layer SHA-256 of this rank's own parameters (its shard; see artifacts/hashing.py)."""
        ...

    def reference_and_start_sha256(self) -> dict[str, str]:
        """{"start", "reference"}: weights_sha256 of rank 0's policy and reference parameters before any step is
        applied ({} on other ranks, without a reference model, or after a step)."""
        ...

    def tensor_hashes(self) -> dict[str, str]:
        """Collective: per-tensor SHA-256 of the exported weights as the engines hold them (artifacts.hashing.
        tensor_hashes, after weights_sha256's cast) on global rank 0 ({} elsewhere): names what differs when an
        engine's weights_sha256 does not match."""
        ...

    def save(self, directory: str, rollout_id: int, *, snapshot: bool = False) -> None:
        """Write model, optimizer, scheduler and RNG state and the applied metrics to `directory`/iter_N (a
        collective; `snapshot`: a step-boundary snapshot: no hashes, no fault hook, only the last two kept)."""
        ...

    def load(self, directory: str) -> int:
        """Restore everything `save` wrote; returns the rollout id saved there."""
        ...
