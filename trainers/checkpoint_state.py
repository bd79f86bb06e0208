"""The checkpoint and step-boundary bookkeeping of `trainers.core.TrainerCore`, as its base class
`CheckpointState`: what every trainer backend does the same way around its own checkpoint format.

- the snapshot a train step is put back from when it fails: an in-memory copy (`Snapshot`), the step-boundary
  snapshot on disk, or the start checkpoint read again;
- meta.json, and the atomic publish of iter_N/ with its latest marker;
- loading the optimizer state and the LR schedule (with the lr it had reached) from a checkpoint;
- the --ci-check-model-hash comparison.
"""

from __future__ import annotations

import abc
import copy
import json
import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from artifacts.atomic import atomic_write_text, fsync_tree
from artifacts.checkpoints import LATEST_FILE
from faults import FaultInjector
from trainers.offload import DiskMoments
from trainers.settings import TrainerSettings

if TYPE_CHECKING:
    from trainers.core import FusedStep


@dataclass
class Snapshot:
    """Trainer state before a rollout's steps (see TrainerCore.train_step)."""

    # clones of the backend's _state_tensors(), same order; None: the start weights, read back by _reload_start
    weights: list[torch.Tensor] | None
    opt_state: dict[Any, dict[str, Any]]  # AdamW state per parameter ({} without an optimizer)
    groups: list[dict[str, Any]]  # the optimizer's param groups less their params (lr, betas, ...)
    sched: dict[str, Any]
    global_step: int


class CheckpointState(abc.ABC):
    """Snapshots, checkpoint metadata and the state loaded from a checkpoint, over the attributes below (which
    `TrainerCore.__init__` and the backend's setup set). A backend provides `_state_tensors` and `model_hash`."""

    s: TrainerSettings
    rank: int
    world_size: int
    global_step: int
    last_applied_rollout: int  # -1: none
    applied: dict[int, list[dict[str, float]]]  # metrics of applied rollouts, by rollout id
    run_id: str
    faults: FaultInjector
    boundary_dir: str | None  # the step-boundary snapshot dir its actor writes (None: none)
    params: list[torch.nn.Parameter]  # optimizer state is indexed in this order
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    _fused: FusedStep | None  # the fused first step's gradients, void once the weights change
    _moments: DiskMoments | None  # --optimizer-offload-dir: where AdamW's moments live

    @abc.abstractmethod
    def _state_tensors(self) -> list[torch.Tensor]:
        """The tensors a step-boundary snapshot copies to restore the model (same order every call)."""

    @abc.abstractmethod
    def model_hash(self) -> dict[str, str]:
        """Per-layer SHA-256 of this rank's own parameters (its shard; see artifacts/hashing.py)."""

    # -- putting back a failed train step ----------------------------------------------------------------
    # Whether this backend reads its step-boundary snapshot back on one rank, with no collective (see
    # _boundary_on_disk); a backend that can sets it and implements _restore_boundary.
    restores_boundary_alone = False

    def _boundary_on_disk(self) -> str | None:
        """Where a failed step of this trainer restores from instead of an in-memory copy of its weights and
        optimizer state (their size again, held through every step): the step-boundary snapshot its actor wrote
        before the step, when there is one of the last applied rollout, one rank writes and reads it (no other rank
        may be mid-write), and the backend reads it back alone. None: `_snapshot` keeps the copy in memory."""
        if self.boundary_dir is None or self.last_applied_rollout < 0 or self.world_size != 1:
            return None
        return self.boundary_dir if self.restores_boundary_alone else None

    def _restore_boundary(self, directory: str | None, rollout_id: int) -> None:
        """Put back the state of the step boundary after `rollout_id` from its snapshot in `directory`; drops
        the failed step's gradients. A snapshot of another rollout is an error naming both."""
        raise NotImplementedError(f"{type(self).__name__} does not restore a step from disk")

    # A backend that can read the weights setup loaded back from its checkpoint defines this method, which puts
    # them back (see _start_on_disk); None: a failed first step restores them from a copy.
    _reload_start: Callable[[], None] | None = None

    def _start_on_disk(self) -> bool:
        """Whether a failed first step (no rollout applied: the weights are setup's) gets its weights back by
        reading the checkpoint setup loaded them from, instead of from a copy held through the step (the
        model's size again, on top of the first step's new gradients and AdamW state)."""
        return self._reload_start is not None and self.last_applied_rollout < 0

    def _snapshot(self, weights: bool = True) -> Snapshot:
        """Copies of everything a train step mutates: weights (unless `weights` is False: `_reload_start` puts
        them back), optimizer state, LR schedule, step. Plain tensor clones (not a deepcopy of the state
        dicts): this runs before every rollout."""
        kept = [t.detach().clone() for t in self._state_tensors()] if weights else None
        opt_state: dict[Any, dict[str, Any]] = {}
        groups: list[dict[str, Any]] = []
        sched: dict[str, Any] = {}
        if self.optimizer is not None and self.scheduler is not None:
            opt_state = {
                p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in st.items()}
                for p, st in self.optimizer.state.items()
            }
            groups = [
                {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                for g in self.optimizer.param_groups
            ]
            sched = copy.deepcopy(self.scheduler.state_dict())
        return Snapshot(kept, opt_state, groups, sched, self.global_step)

    @torch.no_grad()
    def _restore(self, snap: Snapshot) -> None:
        """Put back what `_snapshot` copied; drops the failed step's gradients."""
        self._fused = None
        for p in self.params:
            p.grad = None
        if snap.weights is None:
            assert self._reload_start is not None, "a snapshot without weights needs _reload_start"
            self._reload_start()
        else:
            for t, saved in zip(self._state_tensors(), snap.weights, strict=True):
                t.copy_(saved)
        if self.optimizer is not None and self.scheduler is not None:
            self.optimizer.state = defaultdict(dict, snap.opt_state)
            for group, saved_group in zip(self.optimizer.param_groups, snap.groups, strict=True):
                group.update(saved_group)
            self.scheduler.load_state_dict(snap.sched)
            self._offload_moments()
        self.global_step = snap.global_step

    def _offload_moments(self) -> None:
        """With --optimizer-offload-dir: AdamW's moments into their file where a load or restore brought tensors of
        its own, and out of memory (reading them, as a save or snapshot does, brings their pages back)."""
        if self._moments is not None and self.optimizer is not None:
            self._moments.adopt(self.optimizer)

    # -- checkpoint bookkeeping shared by every format ---------------------------------------------------
    def _checkpoint_meta(self, rollout_id: int, **extra: Any) -> dict[str, Any]:
        """meta.json of iter_{rollout_id}: step, config hash, run id and the applied rollout's metrics (a
        retried train-step after a resume returns them); `extra` (e.g. format) goes after the config hash."""
        return {
            "rollout_id": rollout_id,
            "global_step": self.global_step,
            "config_hash": self.s.config_hash,
            **extra,
            "run_id": self.run_id,
            "applied": self.applied.get(rollout_id),
        }

    def _publish_checkpoint(self, tmp: Path, directory: str, rollout_id: int, *, snapshot: bool) -> None:
        """Rank 0, once `tmp` holds the whole checkpoint: rename it to iter_{rollout_id:07d} (replacing one
        there), then point the latest marker at it. A --save checkpoint's files reach the disk before its name does,
        so that it survives the machine's crash too. `snapshot`: not flushed (it serves the run's recovery from an
        actor's death, and it is written every rollout), no fault hook, and only the last two kept."""
        if not snapshot:
            fsync_tree(tmp)
            self.faults.reach("trainer_save_before_rename", rollout_id=rollout_id)
        final = Path(directory) / f"iter_{rollout_id:07d}"
        old = final.with_name(final.name + ".old")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        atomic_write_text(Path(directory) / LATEST_FILE, str(rollout_id))
        # a snapshot keeps the one before too: a resume may need the state before the rollout that was cut
        if snapshot:
            for stale in sorted(Path(directory).glob("iter_*"))[:-2]:
                shutil.rmtree(stale, ignore_errors=True)

    def _restore_meta(self, path: Path) -> int:
        """Step, last applied rollout and its metrics from `path`/meta.json; returns that rollout id."""
        meta = json.loads((path / "meta.json").read_text())
        self._fused = None  # its gradients were for the weights this load replaced
        self.global_step = int(meta["global_step"])
        self.last_applied_rollout = int(meta["rollout_id"])
        if meta.get("applied") is not None:  # a retried train-step of this rollout returns these metrics
            self.applied[self.last_applied_rollout] = meta["applied"]
        return self.last_applied_rollout

    def _set_optimizer_state(self, state: dict[int, dict[str, torch.Tensor]]) -> None:
        """Load AdamW state given per parameter index (the order of self.params)."""
        assert self.optimizer is not None
        sd = self.optimizer.state_dict()
        sd["state"] = state
        self.optimizer.load_state_dict(sd)
        self._offload_moments()

    def _check_optimizer_fields(self, path: Path, saved: set[str]) -> None:
        """A checkpoint's per-parameter optimizer fields must be this run's optimizer's (AdamW's step and moments,
        or SGD's momentum buffer): the other optimizer's state would fail or mislead at the first step."""
        assert self.optimizer is not None
        if isinstance(self.optimizer, torch.optim.SGD):
            momentum = any(g["momentum"] for g in self.optimizer.param_groups)
            expected = {"momentum_buffer"} if momentum else set()
        else:
            expected = {"step", "exp_avg", "exp_avg_sq"}
        if saved != expected:
            raise ValueError(
                f"{path}: its optimizer state holds {sorted(saved) or 'nothing'}, this run's optimizer keeps "
                f"{sorted(expected) or 'nothing'}: resume with the --optimizer (and --sgd-momentum) it was saved with"
            )

    def _set_scheduler_state(self, saved: dict[str, Any]) -> None:
        """Restore the LR schedule saved as its state_dict less lr_lambdas (nothing when either is absent)."""
        if self.scheduler is None or self.optimizer is None or not saved:
            return
        groups = len(self.optimizer.param_groups)
        # every group follows the one schedule: a checkpoint from before the weight-decay groups (one group)
        # gives each group its values
        saved = {
            k: v * groups if isinstance(v, list) and len(v) == 1 and groups > 1 else v
            for k, v in saved.items()
        }
        self.scheduler.load_state_dict({**self.scheduler.state_dict(), **saved})
        # the scheduler sets a group's lr only when it steps: put back the lr it had reached, or the first
        # step after a resume runs at the initial lr (invisible with a constant schedule)
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
            group["lr"] = lr

    def _check_model_hash(self, path: Path, name: str, fallback: str, hint: str = "") -> None:
        """--ci-check-model-hash: this rank's loaded weights (model_hash()) must match the per-layer hashes in
        `path`/`name` (or `fallback`, a checkpoint saved by fewer ranks), layer by layer."""
        saved = path / name
        if not saved.is_file():
            saved = path / fallback
        if not saved.is_file():
            raise FileNotFoundError(
                f"--ci-check-model-hash: {path} has no {name} (was it saved with --ci-save-model-hash{hint}?)"
            )
        expected = json.loads(saved.read_text())
        got = self.model_hash()
        bad = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
        if bad:
            raise RuntimeError(
                f"--ci-check-model-hash: rank {self.rank} loaded weights differ from {saved.name} "
                f"in layers {bad}"
            )
