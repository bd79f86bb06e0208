"""The torch trainer: one instance per data-parallel rank, gradients summed over a gloo/nccl group.

Loss and advantages come from the registered pure functions in trainers/losses.py and
trainers/advantages.py; the batch schedule from trainers/batching.py. Old-policy log-probs are
computed with exactly the micro-batches the first optimizer step uses, so at that step the new
and old log-probs are bitwise equal (ppo_kl == 0), which the --ci-test KL checker relies on.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from artifacts.atomic import atomic_write_json, atomic_write_text
from artifacts.checkpoints import LATEST_FILE, model_dir, resolve_checkpoint
from artifacts.hashing import layer_hashes, tensor_hashes, weights_sha256
from artifacts.schema import Sample
from artifacts.store import ArtifactRef, read_rollout, read_table, write_table
from faults import FaultInjector
from trainers.advantages import get_advantage_estimator
from trainers.base import Trainer
from trainers.batching import MicroBatch, make_micro_batch, pad_rows, schedule
from trainers.collectives import all_reduce_sum, init_method
from trainers.losses import entropy_from_logits, log_probs_from_logits, policy_objective
from trainers.lr_schedule import lr_lambda
from trainers.rollout_stats import logprob_stats
from trainers.settings import TrainerSettings


@dataclass
class _Snapshot:
    """Trainer state before a rollout's steps (see TorchTrainer._snapshot)."""

    weights: list[torch.Tensor]
    opt_state: dict[Any, dict[str, Any]]
    groups: list[dict[str, Any]]
    sched: dict[str, Any]
    global_step: int


class TorchTrainer:
    """Implements `trainers.base.Trainer` for HF causal LMs in plain torch."""

    def __init__(self, settings: TrainerSettings, checkpoint: str, rank: int, world_size: int) -> None:
        torch.set_num_threads(settings.num_threads)
        self.s, self.checkpoint, self.rank, self.world_size = settings, checkpoint, rank, world_size
        self.applied: dict[int, list[dict[str, float]]] = {}
        self.last_applied_rollout = -1
        self.global_step = 0
        # Content-addressed caches (keyed by the artifact's sha256): the log-prob pass and the train
        # step of one rollout read the same rollout, build the same micro-batches, and the train step
        # reads back the log-probs this rank just wrote. Only the latest rollout is kept.
        self._samples: tuple[str, list[Sample], dict[tuple[int, ...], MicroBatch]] | None = None
        self._written_logprobs: tuple[str, list[dict]] | None = None
        self._perf: dict[str, float] = {}  # seconds of the last rollout's stages on this rank (see perf())
        self.faults = FaultInjector([], "trainer", rank)  # the actor arms it with the run's fault hooks
        self.run_id = ""  # the run this trainer works for (set by the actor; recorded in checkpoints)

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, build model, reference model, optimizer and LR schedule."""
        if not dist.is_initialized():
            rendezvous = init_method(master_addr, master_port, Path(self.s.run_dir) / "ft")
            dist.init_process_group("gloo", init_method=rendezvous,
                                    rank=self.rank, world_size=self.world_size)
        torch.manual_seed(self.s.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
        self.model.train()  # dropout is 0 in our models; train mode matches what the loss sees
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.ref_model = None
        if self.s.need_ref_model:  # the KL loss, or the --ci-test log-prob checker, compares with it
            ref = model_dir(self.s.ref_load) if self.s.ref_load else self.checkpoint
            self.ref_model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
            self.ref_model.train()
            self.ref_model.requires_grad_(False)
        self.params = [p for _, p in self.model.named_parameters()]
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if not self.s.disable_optimizer:  # the knife: no optimizer state, no scheduler, no step
            self.optimizer = torch.optim.AdamW(
                self.params, lr=self.s.lr, betas=(self.s.adam_beta1, self.s.adam_beta2),
                weight_decay=self.s.weight_decay)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(
                lr=self.s.lr, min_lr=self.s.min_lr, warmup_iters=self.s.lr_warmup_iters,
                decay_style=self.s.lr_decay_style, total_steps=self.s.total_steps))
        return {"rank": self.rank, "world_size": self.world_size, "pid": os.getpid(),
                "params": sum(p.numel() for p in self.params)}

    # -- forward -------------------------------------------------------------------------------
    def _response_logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Temperature-scaled logits that predict each response token: [B, T, V] (right padding: no mask
        needed, see MicroBatch)."""
        logits = model(input_ids=mb.input_ids).logits
        idx = mb.response_index[:, :, None].expand(-1, -1, logits.shape[-1])
        return logits.gather(1, idx).float() / self.s.temperature

    def _rollout(self, ref: ArtifactRef) -> list[Sample]:
        """The rollout's samples ordered by sample_index (read once per rollout, by content hash)."""
        if self._samples is None or self._samples[0] != ref.sha256:
            self._samples = (ref.sha256, _ordered(read_rollout(ref)), {})
        return self._samples[1]

    def _micro_batch(self, samples: list[Sample], positions: list[int]) -> MicroBatch:
        """Padded tensors of `positions` of the cached rollout `samples` (built once per rollout)."""
        assert self._samples is not None and self._samples[1] is samples
        cache, key = self._samples[2], tuple(positions)
        if key not in cache:
            cache[key] = make_micro_batch([samples[p] for p in positions], self.pad_id)
        return cache[key]

    def _logprob_rows(self, ref: ArtifactRef) -> list[dict]:
        """Rows of a log-prob artifact; the one this rank just wrote comes from memory."""
        if self._written_logprobs is not None and self._written_logprobs[0] == ref.sha256:
            return self._written_logprobs[1]
        return read_table(ref).to_pylist()

    def _my_micro_batches(self, samples: list[Sample]) -> list[list[list[int]]]:
        return schedule(len(samples), self.s.global_batch_size, self.world_size, self.rank, self.s.micro_batch_size)

    @torch.no_grad()
    def compute_log_probs(self, rollout_ref: ArtifactRef, out_path: str) -> ArtifactRef | None:
        """Old-policy / reference log-probs and entropy per response token (rank 0 writes).
        With --use-rollout-logprobs only the reference log-probs (if any) are computed."""
        samples = self._rollout(rollout_ref)
        rows: dict[int, dict[str, list[float]]] = {}
        policy_s = ref_s = 0.0
        for step in self._my_micro_batches(samples):
            for positions in step:
                batch = [samples[p] for p in positions]
                mb = self._micro_batch(samples, positions)
                for s in batch:
                    rows[s.sample_index] = {}
                if not self.s.use_rollout_logprobs:  # else the engine's log-probs are the old policy's
                    began = time.perf_counter()
                    logits = self._response_logits(self.model, mb)
                    lp, ent = log_probs_from_logits(logits, mb.response_tokens), entropy_from_logits(logits)
                    for i, s in enumerate(batch):
                        n = s.response_length
                        rows[s.sample_index].update(log_probs=lp[i, :n].tolist(), entropy=ent[i, :n].tolist())
                    policy_s += time.perf_counter() - began
                if self.ref_model is not None:
                    began = time.perf_counter()
                    ref = log_probs_from_logits(self._response_logits(self.ref_model, mb), mb.response_tokens)
                    for i, s in enumerate(batch):
                        rows[s.sample_index]["ref_log_probs"] = ref[i, :s.response_length].tolist()
                    ref_s += time.perf_counter() - began
        self._perf = {"perf/log_probs_time": policy_s, "perf/ref_log_probs_time": ref_s}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, rows)
        if self.rank != 0:
            return None
        merged = {k: v for part in gathered for k, v in part.items()}
        order = sorted(merged)
        cols: dict[str, Any] = {"sample_index": pa.array(order, pa.int64())}
        for key in ("log_probs", "ref_log_probs", "entropy"):
            if key in merged[order[0]]:
                cols[key] = pa.array([merged[i][key] for i in order], pa.list_(pa.float32()))
        table = pa.table(cols)
        written = write_table(out_path, table, kind="logprobs", metadata={"rollout_sha256": rollout_ref.sha256})
        self._written_logprobs = (written.sha256, table.to_pylist())  # == read_table(written).to_pylist()
        return written

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        """Trainer-side `rollout/*` stats (log_probs, ref_log_probs, entropy, rollout_log_probs)."""
        return logprob_stats(self._rollout(rollout_ref), self._logprob_rows(logprob_ref))

    # -- training ------------------------------------------------------------------------------
    def train_step(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef,
                   dump_template: str | None = None) -> list[dict[str, float]]:
        """All optimizer steps of one rollout; refuses to apply a rollout twice (see base.Trainer).
        `dump_template` (with {rollout_id} and {rank}) receives this rank's batch after training."""
        samples = self._rollout(rollout_ref)
        rollout_id = samples[0].rollout_id
        if rollout_id in self.applied:
            return self.applied[rollout_id]
        if rollout_id <= self.last_applied_rollout:
            raise RuntimeError(f"rollout {rollout_id} was already applied to these weights "
                               f"(trainer is at rollout {self.last_applied_rollout}); refusing to train twice")
        snapshot = self._snapshot()
        began = time.perf_counter()
        try:
            metrics = self._train_rollout(samples, self._logprob_rows(logprob_ref), dump_template)
        except BaseException:
            self._restore(snapshot)  # a failed step leaves the weights as they were, so a retry is safe
            raise
        self.applied[rollout_id] = metrics
        self.last_applied_rollout = rollout_id
        self._perf["perf/actor_train_time"] = time.perf_counter() - began
        return metrics

    def perf(self) -> dict[str, float]:
        """slime's perf/log_probs_time, perf/ref_log_probs_time and perf/actor_train_time (seconds) of the
        last rollout on this rank."""
        return dict(self._perf)

    def _train_rollout(self, samples: list[Sample], lp_rows: list[dict],
                       dump_template: str | None) -> list[dict[str, float]]:
        old = {r["sample_index"]: r for r in lp_rows}
        if self.s.use_rollout_logprobs:
            missing = [s.sample_index for s in samples if len(s.rollout_log_probs) != s.response_length]
            if missing:
                raise ValueError(f"--use-rollout-logprobs: rollout {samples[0].rollout_id} has samples without "
                                 f"engine log-probs (rollout_log_probs), e.g. sample_index {missing[:5]}")
            old = {s.sample_index: {**old[s.sample_index], "log_probs": list(s.rollout_log_probs)} for s in samples}
        elif any(r.get("log_probs") is None for r in lp_rows):
            raise ValueError(f"rollout {samples[0].rollout_id}: the log-prob artifact has no trainer log_probs "
                             "(computed with --use-rollout-logprobs?); train with that flag or recompute them")
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        groups = torch.tensor([s.group_index for s in samples], dtype=torch.long)
        advantages = get_advantage_estimator(self.s.advantage_estimator)(
            rewards, groups, normalize_std=self.s.normalize_std)
        use_rollout_lp = all(len(s.rollout_log_probs) == s.response_length for s in samples)
        out = []
        for step in self._my_micro_batches(samples):
            # set_to_none: the first micro-batch's gradient is assigned, not added to zeros, so one rank
            # accumulating two micro-batches and two ranks summing one each do the same float additions
            for p in self.params:
                p.grad = None
            sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float32))
            for positions in step:
                batch = [samples[p] for p in positions]
                mb = self._micro_batch(samples, positions)
                for k, v in self._micro_step(batch, mb, advantages[positions], old, use_rollout_lp).items():
                    sums[k] = sums[k] + v
            self.faults.reach("trainer_step_before_allreduce", rollout_id=samples[0].rollout_id)
            for p in self.params:
                if p.grad is None:  # every rank must join every collective
                    p.grad = torch.zeros_like(p)
                all_reduce_sum(p.grad, deterministic=self.s.deterministic_collective)
            keys = sorted(sums)
            vec = torch.stack([sums[k] for k in keys])
            all_reduce_sum(vec, deterministic=self.s.deterministic_collective)
            clip = self.s.clip_grad if self.s.clip_grad > 0 else math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
            record = {f"train/{k}": float(v) for k, v in zip(keys, vec, strict=True)}
            record.update({"train/grad_norm": float(grad_norm), "train/step": self.global_step})
            if self.optimizer is not None and self.scheduler is not None:
                record["train/lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                self.scheduler.step()
            self.global_step += 1
            out.append(record)
        if dump_template:
            mine = [p for step in self._my_micro_batches(samples) for mb in step for p in mb]
            self._dump_batch(dump_template, samples, mine, advantages, old)
        return out

    def _dump_batch(self, template: str, samples: list[Sample], positions: list[int], advantages: torch.Tensor,
                    old: dict[int, dict]) -> None:
        """This rank's share of the rollout as trained: joins back to the rollout by sample_index."""
        rows = [samples[p] for p in positions]
        cols: dict[str, Any] = {
            "rollout_id": pa.array([s.rollout_id for s in rows], pa.int64()),
            "rank": pa.array([self.rank] * len(rows), pa.int64()),
            "sample_index": pa.array([s.sample_index for s in rows], pa.int64()),
            "advantage": pa.array([float(advantages[p]) for p in positions], pa.float32()),
            "reward": pa.array([s.reward for s in rows], pa.float64()),
            "log_probs": pa.array([old[s.sample_index]["log_probs"] for s in rows], pa.list_(pa.float32())),
        }
        if all(old[s.sample_index].get("ref_log_probs") is not None for s in rows):
            cols["ref_log_probs"] = pa.array([old[s.sample_index]["ref_log_probs"] for s in rows],
                                             pa.list_(pa.float32()))
        path = template.format(rollout_id=rows[0].rollout_id, rank=self.rank)
        if not path.endswith(".parquet"):
            path = str(Path(path).with_suffix(".parquet"))  # the train batch is always our columnar format
        write_table(path, pa.table(cols), kind="train_data")

    def _micro_step(self, batch: list[Sample], mb: MicroBatch, adv: torch.Tensor, old: dict[int, dict],
                    use_rollout_lp: bool) -> dict[str, torch.Tensor]:
        width = mb.response_tokens.shape[1]
        logits = self._response_logits(self.model, mb)
        log_probs = log_probs_from_logits(logits, mb.response_tokens)
        if self.s.entropy_coef:
            entropy = entropy_from_logits(logits)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(logits)
        ref = pad_rows([old[s.sample_index]["ref_log_probs"] for s in batch], width) if self.s.use_kl_loss else None
        loss, metrics = policy_objective(
            log_probs, pad_rows([old[s.sample_index]["log_probs"] for s in batch], width),
            adv[:, None].expand_as(log_probs), mb.loss_mask, entropy, ref,
            policy_loss=self.s.policy_loss, eps_clip=self.s.eps_clip,
            eps_clip_high=self.s.eps_clip_high, eps_clip_c=self.s.eps_clip_c,
            entropy_coef=self.s.entropy_coef, use_kl_loss=self.s.use_kl_loss, kl_loss_coef=self.s.kl_loss_coef,
            kl_loss_type=self.s.kl_loss_type,
            rollout_log_probs=pad_rows([s.rollout_log_probs for s in batch], width) if use_rollout_lp else None,
            normaliser=float(self.s.global_batch_size))
        loss.backward()
        return metrics

    def _snapshot(self) -> _Snapshot:
        """Copies of everything a train step mutates: weights, optimizer state, LR schedule, step.
        Plain tensor clones (not a deepcopy of the state dicts): this runs before every rollout."""
        weights = [t.detach().clone() for t in self.model.state_dict().values()]
        opt_state: dict[Any, dict[str, Any]] = {}
        groups: list[dict[str, Any]] = []
        sched: dict[str, Any] = {}
        if self.optimizer is not None and self.scheduler is not None:
            opt_state = {p: {k: v.clone() if torch.is_tensor(v) else copy.deepcopy(v) for k, v in st.items()}
                         for p, st in self.optimizer.state.items()}
            groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            sched = copy.deepcopy(self.scheduler.state_dict())
        return _Snapshot(weights, opt_state, groups, sched, self.global_step)

    @torch.no_grad()
    def _restore(self, snap: _Snapshot) -> None:
        for t, saved in zip(self.model.state_dict().values(), snap.weights, strict=True):
            t.copy_(saved)
        if self.optimizer is not None and self.scheduler is not None:
            self.optimizer.state = defaultdict(dict, snap.opt_state)
            for group, saved_group in zip(self.optimizer.param_groups, snap.groups, strict=True):
                group.update(saved_group)
            self.scheduler.load_state_dict(snap.sched)
        self.global_step = snap.global_step

    # -- weights and checkpoints ---------------------------------------------------------------
    def iter_weights(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """CPU copies of the weights by HF name in buckets of about `bucket_bytes`, on rank 0 (every rank holds
        the same weights, so the others yield nothing)."""
        if self.rank != 0:
            return
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for k, v in self.model.state_dict().items():
            bucket[k] = v.detach().clone().cpu()
            size += v.numel() * v.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = {}, 0
        if bucket:
            yield bucket

    def export_weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of every persistent weight by HF name, on rank 0 ({} elsewhere: the ranks agree)."""
        if self.rank != 0:
            return {}
        return {k: v.detach().clone().cpu() for k, v in self.model.state_dict().items()}

    def weights_sha256(self) -> str:
        """Identity of the weights, equal to weights_sha256(export_weights()), on rank 0 ("" elsewhere)."""
        return weights_sha256(self.model.state_dict()) if self.rank == 0 else ""

    def model_hash(self) -> dict[str, str]:
        """Per-layer SHA-256 of this rank's weights."""
        return layer_hashes(self.model.state_dict())

    def tensor_hashes(self) -> dict[str, str]:
        """Per-tensor SHA-256 of the weights (artifacts.hashing.tensor_hashes), on rank 0 ({} elsewhere)."""
        return tensor_hashes(self.model.state_dict()) if self.rank == 0 else {}

    def save(self, directory: str, rollout_id: int, *, snapshot: bool = False) -> None:
        """Write iter_{rollout_id:07d}/ (model in HF format, optimizer, scheduler, RNG, the applied rollout's
        metrics); rank 0 only. `snapshot`: a step-boundary snapshot for fault recovery (no hashes, no fault
        hook, only the last two kept)."""
        hashes: list[Any] = [None] * self.world_size
        if self.s.save_model_hash and not snapshot:  # one file per rank, from its own weights
            dist.all_gather_object(hashes, self.model_hash())
        if self.rank != 0:
            return
        final = Path(directory) / f"iter_{rollout_id:07d}"
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # clone() breaks the tied embedding/lm_head sharing that safetensors refuses to store
        save_file({k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        self.model.config.save_pretrained(str(tmp))
        opt = {}
        names = [n for n, _ in self.model.named_parameters()]
        if self.optimizer is not None:
            for idx, state in self.optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    opt[f"{names[idx]}::{key}"] = torch.as_tensor(value).clone()
        save_file(opt, str(tmp / "optimizer.safetensors"))
        save_file({"torch_rng": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        sched = self.scheduler.state_dict() if self.scheduler is not None else {}
        atomic_write_json(tmp / "scheduler.json", {k: v for k, v in sched.items() if k != "lr_lambdas"})
        for rank, layer_hash in enumerate(hashes):
            if layer_hash is not None:
                atomic_write_json(tmp / f"model_hash_tp0_pp0_dp{rank}_cp0.json", layer_hash)
        atomic_write_json(tmp / "meta.json", {"rollout_id": rollout_id, "global_step": self.global_step,
                                              "config_hash": self.s.config_hash, "run_id": self.run_id,
                                              "applied": self.applied.get(rollout_id)})
        if not snapshot:
            self.faults.reach("trainer_save_before_rename", rollout_id=rollout_id)
        old = final.with_name(final.name + ".old")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        atomic_write_text(Path(directory) / LATEST_FILE, str(rollout_id))
        if snapshot:  # the one before is kept too: a resume may need the state before the rollout that was cut
            for stale in sorted(Path(directory).glob("iter_*"))[:-2]:
                shutil.rmtree(stale, ignore_errors=True)

    def load(self, directory: str) -> int:
        """Restore the latest (or the given iter_ dir's) checkpoint; returns its rollout id."""
        path = resolve_checkpoint(directory)
        self.model.load_state_dict(load_file(str(path / "model.safetensors")))
        if self.s.check_model_hash:
            self._check_model_hash(path)
        opt = load_file(str(path / "optimizer.safetensors"))
        if opt and self.optimizer is not None:
            names = [n for n, _ in self.model.named_parameters()]
            state: dict[int, dict[str, torch.Tensor]] = defaultdict(dict)
            for key, value in opt.items():
                name, _, field = key.partition("::")
                state[names.index(name)][field] = value
            sd = self.optimizer.state_dict()
            sd["state"] = dict(state)
            self.optimizer.load_state_dict(sd)
        sched = json.loads((path / "scheduler.json").read_text())
        if self.scheduler is not None and self.optimizer is not None and sched:
            self.scheduler.load_state_dict({**self.scheduler.state_dict(), **sched})
            # the scheduler sets a group's lr only when it steps: put back the lr it had reached, or the first
            # step after a resume runs at the initial lr (invisible with a constant schedule)
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_rng"])
        meta = json.loads((path / "meta.json").read_text())
        self.global_step = int(meta["global_step"])
        self.last_applied_rollout = int(meta["rollout_id"])
        if meta.get("applied") is not None:  # a retried train-step of this rollout returns these metrics
            self.applied[self.last_applied_rollout] = meta["applied"]
        return self.last_applied_rollout


    def _check_model_hash(self, path: Path) -> None:
        """--ci-check-model-hash: the loaded weights must match the hashes saved with them, layer by layer."""
        saved = path / f"model_hash_tp0_pp0_dp{self.rank}_cp0.json"
        if not saved.is_file():
            saved = path / "model_hash_tp0_pp0_dp0_cp0.json"
        if not saved.is_file():
            raise FileNotFoundError(f"--ci-check-model-hash: {path} has no model_hash_*.json "
                                    f"(was it saved with --ci-save-model-hash?)")
        expected = json.loads(saved.read_text())
        got = self.model_hash()
        bad = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
        if bad:
            raise RuntimeError(f"--ci-check-model-hash: rank {self.rank} loaded weights differ from {saved.name} "
                               f"in layers {bad}")


def _ordered(samples: list[Sample]) -> list[Sample]:
    return sorted(samples, key=lambda s: s.sample_index)


# mypy checks here that TorchTrainer (constructor included) satisfies the Trainer protocol
_CHECKED: type[Trainer] = TorchTrainer
