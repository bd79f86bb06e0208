"""What every trainer backend does the same way, in one place: `TrainerCore`, the base class of the torch and
Megatron trainers (one instance per rank).

Shared here:
- reading the rollout (ordered by sample_index, once per rollout) and its log-prob rows;
- this data-parallel rank's micro-batch schedule;
- the old-policy / reference log-prob pass that writes the log-prob Parquet;
- the trainer-side rollout stats;
- the train step, with its apply-once guard and the snapshot restored when a step fails;
- the loss of one micro-batch, the train-data dump, perf, the optimizer and LR schedule;
- the checkpoint bookkeeping every format has, in its base class `CheckpointState`
  (trainers/checkpoint_state.py): the step snapshots, meta.json, the atomic publish of iter_N/, the
  scheduler's lr after a load, the --ci-check-model-hash comparison.

A backend supplies the parts that differ (the hooks below):
- the forward to temperature-scaled response logits;
- where it stands in the data-parallel world: rank, size, group, whether it speaks for its model replica;
- the gradient sum over that group, and the global gradient norm;
- which tensors hold its model state, and their per-layer hashes (`CheckpointState`'s hooks).
The backend's `setup` builds the model, reference model, parameters, optimizer and `pad_id`.

Old-policy log-probs are computed with exactly the micro-batches of the first optimizer step. So at that step
the new and old log-probs are bitwise equal (ppo_kl == 0), which the --ci-test KL checker relies on. Since
they are equal, the log-prob pass runs that step's forward with autograd, and its backward too (`FusedStep`).
It replaces the step's own forward, and train_step goes straight to the gradient sum. That is one forward
fewer per rollout, with the same float operations in the same order, so training is bitwise the same. Not
under --ci-test's KL checker (whose point is to compare two forwards), nor with --debug-separate-logprob-pass.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist

from artifacts.hashing import weights_sha256
from artifacts.schema import Sample
from artifacts.store import ArtifactRef, read_rollout, read_table, write_table
from faults import FaultInjector
from trainers.advantages import advantages_of_valid, whiten_weighted
from trainers.base import AlreadyApplied
from trainers.batching import (
    MicroBatch,
    ModelShape,
    forward_flops,
    make_micro_batch,
    pad_rows,
    schedule,
    token_schedule,
)
from trainers.checkpoint_state import CheckpointState
from trainers.collectives import all_reduce_sum
from trainers.custom_loss import build_batch, plugin_loss, resolve_loss
from trainers.determinism import MicroRun, compare_log_probs, compare_train, micro_run
from trainers.losses import entropy_from_logits, get_kl_estimator, log_probs_from_logits, policy_objective
from trainers.lr_schedule import lr_lambda
from trainers.offload import DiskMoments
from trainers.rollout_stats import logprob_stats
from trainers.settings import TrainerSettings


def copy_as(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A CPU copy of `t` (detached), cast to `dtype` on the way when `t` is floating: one copy, never a float32 one
    first (a large embedding would otherwise be held twice over while a sync casts it)."""
    t = t.detach()
    if dtype is not None and t.is_floating_point():
        return t.to(device="cpu", dtype=dtype, copy=True)
    return t.to(device="cpu", copy=True)


def buckets(
    groups: Iterable[dict[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Merge `groups` of named tensors, in order, into buckets of about `bucket_bytes` (a bucket closes after
    the group that fills it: a group is never split). Lazy, so a caller streaming weights holds one bucket."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for group in groups:
        bucket.update(group)
        size += sum(v.numel() * v.element_size() for v in group.values())
        if size >= bucket_bytes:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


def decay_groups(
    params: list[torch.nn.Parameter], names: list[str], weight_decay: float
) -> list[dict[str, Any]]:
    """Optimizer param groups under Megatron's rule: biases and 1-D tensors (norm weights) get no weight decay.
    Consecutive parameters of the same decay share a group, so the parameters keep their order (the optimizer
    state is saved and loaded by position); one group when nothing decays."""
    if weight_decay == 0:
        return [{"params": list(params), "weight_decay": 0.0}]
    groups: list[dict[str, Any]] = []
    for p, name in zip(params, names, strict=True):
        wd = 0.0 if name.endswith(".bias") or p.dim() == 1 else weight_decay
        if groups and groups[-1]["weight_decay"] == wd:
            groups[-1]["params"].append(p)
        else:
            groups.append({"params": [p], "weight_decay": wd})
    return groups


@dataclass
class _CachedRollout:
    """The latest rollout a trainer read (by content hash), and what it built from it."""

    sha256: str
    samples: list[Sample]  # ordered by sample_index
    micro_batches: dict[tuple[int, ...], MicroBatch] = field(default_factory=dict)  # by positions
    advantages: torch.Tensor | None = None  # [N], once asked for
    step_tokens: dict[int, float] = field(default_factory=dict)  # sample_index -> its step's loss tokens


@dataclass
class FusedStep:
    """The first optimizer step of a rollout as run by the log-prob pass: its gradients are in .grad."""

    rollout_sha256: str
    global_step: int  # the weights it was computed on (see TrainerCore._fused_step_applies)
    sums: dict[str, torch.Tensor]  # the step's loss metrics, summed over its micro-batches
    old: dict[int, list[float]]  # sample_index -> the old log-probs it trained against


class TrainerCore(CheckpointState, abc.ABC):
    """The shared half of `trainers.base.Trainer`; a backend subclasses it and fills in the hooks (those of
    `CheckpointState` too)."""

    # built by the backend's setup()
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    params: list[torch.nn.Parameter]  # the trained parameters; optimizer state is indexed in this order
    optimizer: torch.optim.Optimizer | None  # None with --disable-optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    pad_id: int

    def __init__(
        self, settings: TrainerSettings, checkpoint: str, rank: int, world_size: int, device: torch.device
    ) -> None:
        torch.set_num_threads(settings.num_threads)
        if (
            settings.deterministic_mode
        ):  # slime's --deterministic-mode: an op without a deterministic kernel fails
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            torch.use_deterministic_algorithms(True, warn_only=False)
        self.s, self.checkpoint, self.rank, self.world_size = settings, checkpoint, rank, world_size
        self.device = device  # where the model lives; rollout tensors are built on the CPU and moved here
        self.applied: dict[int, list[dict[str, float]]] = {}
        self.last_applied_rollout = -1
        self.global_step = 0
        # Content-addressed caches (keyed by the artifact's sha256): the log-prob pass and the train step of
        # one rollout read the same rollout, build the same micro-batches and advantages, and the train step reads
        # back the log-probs this rank just wrote. Only the latest rollout is kept.
        self._cached: _CachedRollout | None = None
        self._written_logprobs: tuple[str, list[dict[str, Any]]] | None = None
        self._fused: FusedStep | None = None  # left by compute_log_probs for the next train_step
        self._moments: DiskMoments | None = None  # --optimizer-offload-dir (trainers/offload.py)
        # --ci-test's re-execution check (trainers/determinism.py): the rollout's first micro-batch as it ran
        self._capture_first = False
        self._first_run: MicroRun | None = None
        self._perf: dict[str, float] = {}  # seconds of the last rollout's stages on this rank (see perf())
        # where the step-boundary snapshot of the last applied rollout is on disk, once its actor wrote it there
        # (trainers/actor.py); None = nowhere (a trainer used without its actor)
        self.boundary_dir: str | None = None
        self.faults = FaultInjector([], "trainer", rank)  # the actor arms it with the run's fault hooks
        self.run_id = ""  # the run this trainer works for (set by the actor; recorded in checkpoints)
        # --loss-type sft_loss / custom_loss (None: the policy loss); a plug-in that does not import fails here
        self._plugin_loss = resolve_loss(settings.loss_type, settings.custom_loss_function_path)

    # -- hooks: what a backend provides --------------------------------------------------------------
    @abc.abstractmethod
    def _response_logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Temperature-scaled logits that predict each response token: [B, T, V] float32 on self.device,
        V the HF vocab (B, T as in `mb`)."""

    @property
    @abc.abstractmethod
    def dp_rank(self) -> int:
        """This rank's data-parallel rank (its model replica)."""

    @property
    @abc.abstractmethod
    def dp_size(self) -> int:
        """The number of model replicas."""

    @property
    @abc.abstractmethod
    def dp_group(self) -> dist.ProcessGroup | None:
        """The data-parallel process group (None: the default group)."""

    @property
    @abc.abstractmethod
    def replica_lead(self) -> bool:
        """Whether this rank speaks for its replica: its log-prob rows are the ones gathered, it writes the
        replica's train-data dump (the other ranks of a replica hold the same values)."""

    def _token_outputs(self, model: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob of each response token and entropy of its distribution, ([B, T], [B, T]) float32, right
        padded like mb.response_tokens. The log-probs carry a graph when grad is enabled; the entropy only
        when it is in the loss (--entropy-coef), else it is a metric."""
        logits = self._response_logits(model, mb)
        log_probs = log_probs_from_logits(logits, mb.response_tokens.to(self.device))
        with torch.set_grad_enabled(torch.is_grad_enabled() and bool(self.s.entropy_coef)):
            entropy = entropy_from_logits(logits)
        return log_probs, entropy

    @abc.abstractmethod
    def _sum_grads(self) -> None:
        """Sum every parameter's .grad (all set) in place over the data-parallel group (deterministically
        with --debug-deterministic-collective)."""

    @abc.abstractmethod
    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to a global norm of `max_norm` (inf: no clipping); returns the norm before."""

    # -- set-up ----------------------------------------------------------------------------------------
    def _wants_ref_model(self) -> bool:
        """Whether setup loads the reference model: the KL loss, the --ci-test log-prob checker, or
        --kl-coef reward shaping compare with it."""
        return self.s.need_ref_model or self.s.kl_coef != 0

    def reference_and_start_sha256(self) -> dict[str, str]:
        """{"start": ..., "reference": ...}: artifacts.hashing.weights_sha256 of this rank's policy and reference
        parameters (one shard under tensor parallelism, the same one of both), on rank 0 before any step is
        applied ({} elsewhere, without a reference model, or later): a reference other than the starting model
        shows as two hashes."""
        if self.rank != 0 or self.ref_model is None or self.last_applied_rollout >= 0:
            return {}
        return {
            "start": weights_sha256(dict(self.model.named_parameters())),
            "reference": weights_sha256(dict(self.ref_model.named_parameters())),
        }

    def _param_names(self) -> list[str]:
        """Names of self.params, same order (Megatron's weight-decay rule reads them)."""
        by_id = {id(p): n for n, p in self.model.named_parameters()}
        return [by_id[id(p)] for p in self.params]

    def _build_optimizer(self) -> None:
        """--optimizer (AdamW or SGD) over self.params with the shared LR schedule; neither with
        --disable-optimizer (the knife: no optimizer state, no scheduler, no step)."""
        self.optimizer = None
        self.scheduler = None
        if self.s.disable_optimizer:
            return
        groups = decay_groups(self.params, self._param_names(), self.s.weight_decay)
        if self.s.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=self.s.lr, momentum=self.s.sgd_momentum)
        else:
            self.optimizer = torch.optim.AdamW(
                groups,
                lr=self.s.lr,
                betas=(self.s.adam_beta1, self.s.adam_beta2),
                # one kernel per tensor instead of ~10 ops; elementwise, so bitwise run to run
                fused=True,
            )
            if self.s.optimizer_offload_dir is not None:
                self._moments = DiskMoments(self.s.optimizer_offload_dir, self.params, self.rank)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_lambda(
                lr=self.s.lr,
                min_lr=self.s.min_lr,
                warmup_iters=self.s.lr_warmup_iters,
                decay_style=self.s.lr_decay_style,
                total_steps=self.s.total_steps,
            ),
        )

    # -- the rollout and its log-prob rows --------------------------------------------------------------
    def _rollout(self, ref: ArtifactRef) -> list[Sample]:
        """The rollout's samples ordered by sample_index (read once per rollout, by content hash)."""
        if self._cached is None or self._cached.sha256 != ref.sha256:
            self._cached = _CachedRollout(ref.sha256, sorted(read_rollout(ref), key=lambda s: s.sample_index))
        return self._cached.samples

    def _cached_rollout(self, samples: list[Sample]) -> _CachedRollout:
        assert self._cached is not None and self._cached.samples is samples, "not the cached rollout"
        return self._cached

    def _micro_batch(self, samples: list[Sample], positions: list[int]) -> MicroBatch:
        """Padded CPU tensors of `positions` of the cached rollout `samples` (built once per rollout)."""
        cache, key = self._cached_rollout(samples).micro_batches, tuple(positions)
        if key not in cache:
            cache[key] = make_micro_batch([samples[p] for p in positions], self.pad_id)
        return cache[key]

    def _logprob_rows(self, ref: ArtifactRef) -> list[dict[str, Any]]:
        """Rows of a log-prob artifact; the one this rank just wrote comes from memory."""
        if self._written_logprobs is not None and self._written_logprobs[0] == ref.sha256:
            return self._written_logprobs[1]
        return read_table(ref).to_pylist()

    def _my_micro_batches(self, samples: list[Sample]) -> list[list[list[int]]]:
        """This data-parallel rank's steps -> micro-batches -> positions (a replica's ranks share them):
        slime's token-budget packing and FLOPs balancing with --use-dynamic-batch-size / --balance-data."""
        if not (self.s.use_dynamic_batch_size or self.s.balance_data):
            return schedule(
                len(samples), self.s.global_batch_size, self.dp_size, self.dp_rank, self.s.micro_batch_size
            )
        lengths = [len(s.prompt_tokens) + s.response_length for s in samples]
        workloads = None
        if self.s.balance_data:
            shape = ModelShape.from_hf_config(json.loads((Path(self.checkpoint) / "config.json").read_text()))
            workloads = [forward_flops(n, shape) for n in lengths]
        return token_schedule(
            lengths,
            self.s.global_batch_size,
            self.dp_size,
            self.dp_rank,
            micro_batch_size=self.s.micro_batch_size,
            max_tokens=self.s.max_tokens_per_gpu if self.s.use_dynamic_batch_size else None,
            workloads=workloads,
        )

    def _fuses_first_step(self) -> bool:
        """Whether the log-prob pass runs the first step's forward and backward (module docstring); not with
        --kl-coef, whose advantages need every sample's log-probs first."""
        return self.s.fuse_first_step and not self.s.use_rollout_logprobs and not self._kl_shaped()

    def _kl_shaped(self) -> bool:
        """--kl-coef shapes the advantages per token (slime: reinforce_plus_plus_baseline only)."""
        return self.s.kl_coef != 0 and self.s.advantage_estimator == "reinforce_plus_plus_baseline"

    @torch.no_grad()
    def compute_log_probs(self, rollout_ref: ArtifactRef, out_path: str) -> ArtifactRef | None:
        """Old-policy / reference log-probs and entropy per response token; every rank computes its share,
        global rank 0 writes the Parquet (sample_index, log_probs, ref_log_probs, entropy: the columns
        computed) and returns its ref. With --use-rollout-logprobs only the reference log-probs (if any).
        Fused (module docstring): the first step's micro-batches also run their loss and backward.
        AlreadyApplied, before anything is computed or written, for a rollout whose step was applied."""
        samples = self._rollout(rollout_ref)
        self._offload_moments()  # out of memory for this pass's (fused first step's) backward
        if samples and samples[0].rollout_id <= self.last_applied_rollout:
            # version k holds the steps of rollouts < k: rollout N's log-probs need version N
            rollout_id = samples[0].rollout_id
            raise AlreadyApplied(
                f"rollout {rollout_id}, log-prob: the trainer holds weight version {self.last_applied_rollout + 1} "
                f"(rollout {self.last_applied_rollout}'s step applied) but the pass needs version {rollout_id}; "
                "refusing to recompute the log-probs of a rollout it trained on"
            )
        rows: dict[int, dict[str, list[float]]] = {}
        policy_s = ref_s = 0.0
        self._fused = None
        fuse = self._fuses_first_step()
        self._capture_first, self._first_run = fuse and self.s.ci_reexecute, None
        advantages = self._advantages(samples) if fuse else None
        use_rollout_lp = all(len(s.rollout_log_probs) == s.response_length for s in samples)
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float32))
        for k, step in enumerate(self._my_micro_batches(samples)):
            if fuse and k == 0:
                for p in self.params:
                    p.grad = None
            for positions in step:
                batch = [samples[p] for p in positions]
                mb = self._micro_batch(samples, positions)
                for s in batch:
                    rows[s.sample_index] = {}
                if self.ref_model is not None:
                    began = time.perf_counter()
                    ref, _ = self._token_outputs(self.ref_model, mb)
                    for i, s in enumerate(batch):
                        rows[s.sample_index]["ref_log_probs"] = ref[i, : s.response_length].tolist()
                    ref_s += time.perf_counter() - began
                if not self.s.use_rollout_logprobs:  # else the engine's log-probs are the old policy's
                    began = time.perf_counter()
                    with torch.set_grad_enabled(fuse and k == 0):
                        lp, ent = self._token_outputs(self.model, mb)
                        lp_list, ent_list = lp.tolist(), ent.tolist()  # one conversion each, not one a sample
                        for i, s in enumerate(batch):
                            n = s.response_length
                            rows[s.sample_index].update(log_probs=lp_list[i][:n], entropy=ent_list[i][:n])
                        if fuse and k == 0:
                            assert advantages is not None
                            metrics = self._micro_step(
                                batch, mb, advantages[positions], rows, use_rollout_lp, (lp, ent)
                            )
                            for key, v in metrics.items():
                                sums[key] = sums[key] + v.cpu()
                    policy_s += time.perf_counter() - began
        if fuse and samples:
            first = [samples[p] for mb in self._my_micro_batches(samples)[0] for p in mb]
            self._fused = FusedStep(
                rollout_ref.sha256,
                self.global_step,
                dict(sums),
                {s.sample_index: rows[s.sample_index]["log_probs"] for s in first},
            )
        self._perf = {"perf/log_probs_time": policy_s, "perf/ref_log_probs_time": ref_s}
        gathered: list[Any] = [rows]  # one rank: nothing to gather, so no pickling round trip
        if self.world_size > 1:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, rows if self.replica_lead else {})
        if self.rank != 0:
            return None
        merged = {k: v for part in gathered for k, v in part.items()}
        order = sorted(merged)
        cols: dict[str, Any] = {"sample_index": pa.array(order, pa.int64())}
        for key in ("log_probs", "ref_log_probs", "entropy"):
            if key in merged[order[0]]:
                cols[key] = pa.array([merged[i][key] for i in order], pa.list_(pa.float32()))
        table = pa.table(cols)
        written = write_table(
            out_path, table, kind="logprobs", metadata={"rollout_sha256": rollout_ref.sha256}
        )
        self._written_logprobs = (written.sha256, table.to_pylist())  # == read_table(written).to_pylist()
        return written

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        """Trainer-side `rollout/*` stats (log_probs, ref_log_probs, entropy, rollout_log_probs)."""
        return logprob_stats(self._rollout(rollout_ref), self._logprob_rows(logprob_ref))

    # -- training ----------------------------------------------------------------------------------------
    def train_step(
        self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef, dump_template: str | None = None
    ) -> list[dict[str, float]]:
        """All optimizer steps of one rollout; refuses to apply a rollout twice (see base.Trainer).
        `dump_template` ({rollout_id}, {rank} = the DP rank) receives this replica's batch after training."""
        samples = self._rollout(rollout_ref)
        rollout_id = samples[0].rollout_id
        if rollout_id in self.applied:
            return self.applied[rollout_id]
        if rollout_id <= self.last_applied_rollout:
            raise RuntimeError(
                f"rollout {rollout_id} was already applied to these weights "
                f"(trainer is at rollout {self.last_applied_rollout}); refusing to train twice"
            )
        fused, self._fused = self._fused, None  # used by this call or never
        lp_rows = self._logprob_rows(logprob_ref)
        if fused is not None and not self._fused_step_applies(fused, rollout_ref, lp_rows):
            fused = None
        boundary = self._boundary_on_disk()
        snapshot = None if boundary else self._snapshot(weights=not self._start_on_disk())
        self._offload_moments()  # out of memory for the step's backward (a snapshot just read them)
        began = time.perf_counter()
        try:
            again = None
            if self.s.ci_reexecute:  # the weights are still the step boundary's: the snapshot's
                self._reexecute_log_probs(samples, lp_rows)
                again = self._reexecute_train(samples, lp_rows)
                if fused is None:
                    self._capture_first, self._first_run = True, None
            metrics = self._train_rollout(samples, lp_rows, dump_template, fused)
            if again is not None:
                self._compare_train(samples[0].rollout_id, again)
        except BaseException:
            # a failed step leaves the weights as they were, so a retry is safe
            if snapshot is not None:
                self._restore(snapshot)
            else:
                self._restore_boundary(boundary, self.last_applied_rollout)
            raise
        self.applied[rollout_id] = metrics
        self.last_applied_rollout = rollout_id
        for p in self.params:  # each step assigns fresh gradients: none are held while the engines generate
            p.grad = None
        self._perf["perf/actor_train_time"] = time.perf_counter() - began
        return metrics

    def _fused_step_applies(
        self, fused: FusedStep, rollout_ref: ArtifactRef, lp_rows: list[dict[str, Any]]
    ) -> bool:
        """Whether `fused` is this rollout's first step on these weights, trained against these log-probs
        (a train-step run alone, e.g. replayed from another run's artifacts, is not)."""
        if fused.rollout_sha256 != rollout_ref.sha256 or fused.global_step != self.global_step:
            return False
        given = {r["sample_index"]: r.get("log_probs") for r in lp_rows}
        return all(given.get(index) == old for index, old in fused.old.items())

    def perf(self) -> dict[str, float]:
        """slime's perf/log_probs_time, perf/ref_log_probs_time and perf/actor_train_time (seconds) of the
        last rollout on this rank."""
        return dict(self._perf)

    def _old_log_probs(
        self, samples: list[Sample], lp_rows: list[dict[str, Any]]
    ) -> dict[int, dict[str, Any]]:
        """Per sample_index: the old-policy (and reference) log-probs the loss compares with."""
        old = {r["sample_index"]: r for r in lp_rows}
        if self.s.use_rollout_logprobs:
            missing = [s.sample_index for s in samples if len(s.rollout_log_probs) != s.response_length]
            if missing:
                raise ValueError(
                    f"--use-rollout-logprobs: rollout {samples[0].rollout_id} has samples without "
                    f"engine log-probs (rollout_log_probs), e.g. sample_index {missing[:5]}"
                )
            return {
                s.sample_index: {**old[s.sample_index], "log_probs": list(s.rollout_log_probs)}
                for s in samples
            }
        if any(r.get("log_probs") is None for r in lp_rows):
            raise ValueError(
                f"rollout {samples[0].rollout_id}: the log-prob artifact has no trainer log_probs "
                "(computed with --use-rollout-logprobs?); train with that flag or recompute them"
            )
        return old

    def _advantages(self, samples: list[Sample]) -> torch.Tensor:
        """Per-sample advantages of the cached rollout `samples`, [N] in sample order (computed once: the fused
        log-prob pass and train_step both ask). A failed sample (its reward raised) is left out of its group's
        statistics and gets 0. --normalize-advantages whitens them over the rollout's loss tokens: every rank
        holds the whole rollout, so its statistics are the all-reduced ones of slime without a collective
        (with --kl-coef shaping, `_shaped_advantages` whitens per token instead)."""
        cached = self._cached_rollout(samples)
        if cached.advantages is None:
            rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
            groups = torch.tensor([s.group_index for s in samples], dtype=torch.long)
            valid = torch.tensor([s.status != "failed" for s in samples], dtype=torch.bool)
            adv = advantages_of_valid(
                self.s.advantage_estimator, rewards, groups, valid, normalize_std=self.s.normalize_std
            )
            if self.s.normalize_advantages and not self._kl_shaped():
                adv = whiten_weighted(adv, torch.tensor([float(sum(s.loss_mask)) for s in samples]))
            cached.advantages = adv
        return cached.advantages

    def _shaped_advantages(self, samples: list[Sample], old: dict[int, dict[str, Any]]) -> torch.Tensor:
        """--kl-coef (slime's reward shaping for reinforce_plus_plus_baseline): per token,
        A - kl_coef * KL(old policy || reference) by the --kl-loss-type estimator, whitened over the rollout's
        loss tokens with --normalize-advantages. [N, T_max] float32, zero padded."""
        adv = self._advantages(samples)
        kl = get_kl_estimator(self.s.kl_loss_type)
        width = max((s.response_length for s in samples), default=0)
        rows = []
        for i, s in enumerate(samples):
            lp = torch.tensor(old[s.sample_index]["log_probs"], dtype=torch.float32)
            ref = torch.tensor(old[s.sample_index]["ref_log_probs"], dtype=torch.float32)
            rows.append(adv[i] - self.s.kl_coef * kl(lp, ref))
        if self.s.normalize_advantages:
            mask = torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.float32)
            flat = whiten_weighted(torch.cat(rows), mask)
            rows = list(flat.split([s.response_length for s in samples]))
        return pad_rows([r.tolist() for r in rows], width)

    def _normaliser(self, batch: list[Sample]) -> float:
        """What a micro-batch's loss sums are divided by: the global batch size, or with
        --calculate-per-token-loss the loss tokens of its optimizer step over every rank (each sample counting
        at least 1, as in slime). Steps are consecutive runs of the global batch in sample order."""
        if not self.s.per_token_loss:
            return float(self.s.global_batch_size)
        assert self._cached is not None, "no rollout read"
        cached, samples = self._cached, self._cached.samples
        if not cached.step_tokens:
            gbs = self.s.global_batch_size
            for start in range(0, len(samples), gbs):
                step = samples[start : start + gbs]
                tokens = float(sum(max(sum(s.loss_mask), 1) for s in step))
                cached.step_tokens.update((s.sample_index, tokens) for s in step)
        return cached.step_tokens[batch[0].sample_index]

    def _train_rollout(
        self,
        samples: list[Sample],
        lp_rows: list[dict[str, Any]],
        dump_template: str | None,
        fused: FusedStep | None = None,
    ) -> list[dict[str, float]]:
        """The optimizer steps of one rollout (no guard, no snapshot: see train_step); one record a step.
        `fused`: the first step's forward and backward already ran (its gradients are in .grad)."""
        old = self._old_log_probs(samples, lp_rows)
        advantages = self._shaped_advantages(samples, old) if self._kl_shaped() else self._advantages(samples)
        use_rollout_lp = all(len(s.rollout_log_probs) == s.response_length for s in samples)
        out = []
        for k, step in enumerate(self._my_micro_batches(samples)):
            sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float32))
            if k == 0 and fused is not None:
                sums.update(fused.sums)
            else:
                # set_to_none: the first micro-batch's gradient is assigned, not added to zeros, so one rank
                # accumulating two micro-batches and two ranks summing one each do the same float additions
                for p in self.params:
                    p.grad = None
                for positions in step:
                    batch = [samples[p] for p in positions]
                    mb = self._micro_batch(samples, positions)
                    for key, v in self._micro_step(
                        batch, mb, advantages[positions], old, use_rollout_lp
                    ).items():
                        sums[key] = sums[key] + v.cpu()
            self.faults.reach("trainer_step_before_allreduce", rollout_id=samples[0].rollout_id)
            for p in self.params:
                if p.grad is None:  # every rank must join every collective
                    p.grad = torch.zeros_like(p)
            self._sum_grads()
            keys = sorted(sums)
            vec = torch.stack([sums[k] for k in keys]).to(self.device)
            all_reduce_sum(vec, deterministic=self.s.deterministic_collective, group=self.dp_group)
            grad_norm = self._clip_grad_norm(self.s.clip_grad if self.s.clip_grad > 0 else math.inf)
            record = {f"train/{k}": float(v) for k, v in zip(keys, vec.cpu(), strict=True)}
            record.update({"train/grad_norm": float(grad_norm), "train/step": self.global_step})
            if self.optimizer is not None and self.scheduler is not None:
                record["train/lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
                if self._moments is not None:
                    self._moments.step(self.optimizer)
                else:
                    self.optimizer.step()
                self.scheduler.step()
            self.global_step += 1
            out.append(record)
        if dump_template and self.replica_lead:
            mine = [p for step in self._my_micro_batches(samples) for mb in step for p in mb]
            self._dump_batch(dump_template, samples, mine, self._advantages(samples), old)
        return out

    def _micro_step(
        self,
        batch: list[Sample],
        mb: MicroBatch,
        adv: torch.Tensor,
        old: dict[int, dict[str, Any]],
        use_rollout_lp: bool,
        outputs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Forward and backward of one micro-batch (gradients accumulate in .grad); returns the loss
        metrics, sums over the micro-batch already divided by `_normaliser`. `adv`: [B], or [B, >= T] per
        token (--kl-coef shaping).
        `outputs`: this micro-batch's `_token_outputs`, when the caller already ran the forward."""
        width, dev = mb.response_tokens.shape[1], self.device
        if self._plugin_loss is not None:
            plugin_batch = build_batch(batch, adv, old, use_rollout_lp=use_rollout_lp, device=dev)
            loss, metrics = plugin_loss(
                self._plugin_loss,
                self.s.custom_loss_function_path or self.s.loss_type,
                self.s.plugin_args,
                plugin_batch,
                self._response_logits(self.model, mb),
                normaliser=self._normaliser(batch),
                per_token=self.s.per_token_loss,
            )
            loss.backward()
            self._captured(batch, metrics)
            return metrics
        log_probs, entropy = outputs if outputs is not None else self._token_outputs(self.model, mb)
        ref = (
            pad_rows([old[s.sample_index]["ref_log_probs"] for s in batch], width).to(dev)
            if self.s.use_kl_loss
            else None
        )
        rollout_lp = pad_rows([s.rollout_log_probs for s in batch], width).to(dev) if use_rollout_lp else None
        loss, metrics = policy_objective(
            log_probs,
            pad_rows([old[s.sample_index]["log_probs"] for s in batch], width).to(dev),
            adv[:, :width].to(dev) if adv.dim() == 2 else adv.to(dev)[:, None].expand_as(log_probs),
            mb.loss_mask.to(dev),
            entropy,
            ref,
            policy_loss=self.s.policy_loss,
            eps_clip=self.s.eps_clip,
            eps_clip_high=self.s.eps_clip_high,
            eps_clip_c=self.s.eps_clip_c,
            entropy_coef=self.s.entropy_coef,
            use_kl_loss=self.s.use_kl_loss,
            kl_loss_coef=self.s.kl_loss_coef,
            kl_loss_type=self.s.kl_loss_type,
            rollout_log_probs=rollout_lp,
            normaliser=self._normaliser(batch),
            per_token=self.s.per_token_loss,
        )
        loss.backward()
        self._captured(batch, metrics)
        return metrics

    def _captured(self, batch: list[Sample], metrics: dict[str, torch.Tensor]) -> None:
        """Keep the rollout's first micro-batch's metrics and gradients for `_reexecute_train`."""
        if self._capture_first:
            self._capture_first = False
            self._first_run = micro_run([s.sample_index for s in batch], metrics, self.params)

    @torch.no_grad()
    def _reexecute_log_probs(self, samples: list[Sample], lp_rows: list[dict[str, Any]]) -> None:
        """--ci-test: the first micro-batch's old-policy log-probs once more on the step-boundary weights (the train
        step has not moved them yet), bitwise against what the log-prob pass wrote."""
        written: dict[int, Any] = {r["sample_index"]: r.get("log_probs") for r in lp_rows}
        steps = self._my_micro_batches(samples)
        if self.s.use_rollout_logprobs or not steps or not steps[0] or None in written.values():
            return
        positions = steps[0][0]
        lp, _ = self._token_outputs(self.model, self._micro_batch(samples, positions))
        rows = lp.tolist()
        again = {
            samples[p].sample_index: rows[i][: samples[p].response_length] for i, p in enumerate(positions)
        }
        compare_log_probs(samples[0].rollout_id, {i: written[i] for i in again}, again)

    def _reexecute_train(self, samples: list[Sample], lp_rows: list[dict[str, Any]]) -> MicroRun | None:
        """--ci-test: the rollout's first micro-batch's forward and backward on the step-boundary weights, before
        the step runs it (or after the fused log-prob pass ran it: its gradients are put back). The RNG is not put
        back, as a retry from the snapshot would not: an op that draws from it shows as a difference."""
        steps = self._my_micro_batches(samples)
        if not steps or not steps[0]:
            return None
        positions = steps[0][0]
        old = self._old_log_probs(samples, lp_rows)
        adv = self._shaped_advantages(samples, old) if self._kl_shaped() else self._advantages(samples)
        use_rollout_lp = all(len(s.rollout_log_probs) == s.response_length for s in samples)
        grads = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
        self._capture_first = False
        try:
            batch = [samples[p] for p in positions]
            metrics = self._micro_step(
                batch, self._micro_batch(samples, positions), adv[positions], old, use_rollout_lp
            )
            return micro_run([s.sample_index for s in batch], metrics, self.params)
        finally:
            for p, g in zip(self.params, grads, strict=True):
                p.grad = g

    def _compare_train(self, rollout_id: int, again: MicroRun) -> None:
        """The re-execution against the first micro-batch as the step ran it (trainers/determinism.py)."""
        ran, self._first_run, self._capture_first = self._first_run, None, False
        if ran is None:
            return
        names = {id(p): n for n, p in self.model.named_parameters()}
        labels = [names.get(id(p), f"parameter {i}") for i, p in enumerate(self.params)]
        compare_train(rollout_id, ran, again, labels)

    def _dump_batch(
        self,
        template: str,
        samples: list[Sample],
        positions: list[int],
        advantages: torch.Tensor,
        old: dict[int, dict[str, Any]],
    ) -> None:
        """This replica's share of the rollout as trained (rank column = DP rank): joins back to the rollout
        by sample_index. `advantages`: [N] over the whole rollout, indexed by position."""
        rows = [samples[p] for p in positions]
        cols: dict[str, Any] = {
            "rollout_id": pa.array([s.rollout_id for s in rows], pa.int64()),
            "rank": pa.array([self.dp_rank] * len(rows), pa.int64()),
            "sample_index": pa.array([s.sample_index for s in rows], pa.int64()),
            "advantage": pa.array([float(advantages[p]) for p in positions], pa.float32()),
            "reward": pa.array([s.reward for s in rows], pa.float64()),
            "log_probs": pa.array([old[s.sample_index]["log_probs"] for s in rows], pa.list_(pa.float32())),
        }
        if all(old[s.sample_index].get("ref_log_probs") is not None for s in rows):
            cols["ref_log_probs"] = pa.array(
                [old[s.sample_index]["ref_log_probs"] for s in rows], pa.list_(pa.float32())
            )
        path = template.format(rollout_id=rows[0].rollout_id, rank=self.dp_rank)
        if not path.endswith(".parquet"):
            path = str(Path(path).with_suffix(".parquet"))  # the train batch is always our columnar format
        write_table(path, pa.table(cols), kind="train_data")
