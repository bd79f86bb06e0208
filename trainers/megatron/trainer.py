"""The Megatron-core trainer: megatron's GPTModel, tensor parallel within a model replica and data parallel
across replicas, over gloo on the CPU (nccl on CUDA).

Same semantics as the torch backend (trainers/torch_trainer/trainer.py), which it must match within
float32 rounding on the same HF checkpoint and rollout: the same micro-batch schedule (trainers.batching),
right-padded sequences with a causal mask, temperature-scaled logits, the shared loss and advantage
functions, the loss normaliser (the global batch size), AdamW with the shared LR schedule, clipping by the
global grad norm, the apply-once guard, and a snapshot restored when a step fails. Old-policy log-probs are
computed with exactly the micro-batches of the first optimizer step, so ppo_kl == 0 at that step.

Ranks: TP groups are consecutive ranks, DP rank = rank // TP. Every TP rank of a replica computes the same
loss from logits gathered over the vocab (only the response rows are gathered); gradients are summed over
the DP group, deterministically with --debug-deterministic-collective.
"""

from __future__ import annotations

import copy
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist

from artifacts.checkpoints import model_dir
from artifacts.hashing import layer_hashes, tensor_hashes, weights_sha256_of
from artifacts.schema import Sample
from artifacts.store import ArtifactRef, read_rollout, read_table, write_table
from faults import FaultInjector
from trainers.advantages import get_advantage_estimator
from trainers.base import Trainer
from trainers.batching import MicroBatch, make_micro_batch, pad_rows, schedule
from trainers.collectives import all_reduce_sum, init_method
from trainers.losses import entropy_from_logits, log_probs_from_logits, policy_objective
from trainers.lr_schedule import lr_lambda
from trainers.megatron import checkpoint, convert, persistence
from trainers.megatron.arch import ModelArch
from trainers.megatron.model import build_model, causal_mask, init_parallel
from trainers.megatron.parallel import Layout, clip_grad_norm, gather_vocab, sum_grads_over_dp
from trainers.rollout_stats import logprob_stats
from trainers.settings import TrainerSettings


@dataclass
class _Snapshot:
    """Trainer state before a rollout's steps (see MegatronTrainer._snapshot)."""

    weights: list[torch.Tensor]
    opt_state: dict[Any, dict[str, Any]]
    groups: list[dict[str, Any]]
    sched: dict[str, Any]
    global_step: int


class MegatronTrainer:
    """Implements `trainers.base.Trainer` on megatron-core for HF Qwen2/Llama checkpoints."""

    def __init__(
        self, settings: TrainerSettings, checkpoint: str, rank: int, world_size: int, device: str | None = None
    ) -> None:
        """`device`: "cpu", "cuda" or None = CUDA when available (one GPU per rank: rank % device count)."""
        self.s = settings
        torch.set_num_threads(self.s.num_threads)
        self.checkpoint, self.rank, self.world_size = checkpoint, rank, world_size
        kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = (
            torch.device("cuda", rank % torch.cuda.device_count()) if kind == "cuda" else torch.device(kind)
        )
        self.applied: dict[int, list[dict[str, float]]] = {}
        self.last_applied_rollout = -1
        self.global_step = 0
        self._samples: tuple[str, list[Sample], dict[tuple[int, ...], MicroBatch]] | None = None
        self._written_logprobs: tuple[str, list[dict]] | None = None
        self._perf: dict[str, float] = {}
        self.faults = FaultInjector([], "trainer", rank)  # the actor arms it with the run's fault hooks
        self.run_id = ""  # the run this trainer works for (set by the actor; recorded in checkpoints)

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group and megatron's parallel state; build model, reference model, AdamW and
        the LR schedule; load the HF checkpoint's weights (converted, this rank's TP shard)."""
        tp = self.s.tensor_model_parallel_size
        if self.world_size % tp:
            raise ValueError(
                f"world size {self.world_size} is not a multiple of --tensor-model-parallel-size {tp}"
            )
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # megatron allocates on the current device
        if not dist.is_initialized():
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo",
                init_method=init_method(master_addr, master_port, Path(self.s.run_dir) / "ft"),
                rank=self.rank,
                world_size=self.world_size,
            )
        torch.manual_seed(self.s.seed)
        init_parallel(tp, self.s.seed, self.device)
        self.layout = Layout.current()
        self.arch = ModelArch.from_pretrained(self.checkpoint)
        self.arch.check_tp(tp)
        self.config_json = (Path(self.checkpoint) / "config.json").read_text()
        self.pad_id = self.arch.pad_token_id or 0  # what the torch backend pads with
        self.model = self._build(Path(self.checkpoint))
        self.ref_model = None
        if self.s.need_ref_model:
            self.ref_model = self._build(
                model_dir(self.s.ref_load) if self.s.ref_load else Path(self.checkpoint)
            )
            self.ref_model.requires_grad_(False)
        self.params = list(self.model.parameters())
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if not self.s.disable_optimizer:
            self.optimizer = torch.optim.AdamW(
                self.params,
                lr=self.s.lr,
                betas=(self.s.adam_beta1, self.s.adam_beta2),
                weight_decay=self.s.weight_decay,
            )
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
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "tp_rank": self.layout.tp_rank,
            "dp_rank": self.layout.dp_rank,
            "device": str(self.device),
            "params": sum(p.numel() for p in self.params),
        }

    def _build(self, hf_dir: Path) -> torch.nn.Module:
        """A GPTModel holding this rank's shard of the HF weights in `hf_dir` (same architecture required)."""
        arch = ModelArch.from_pretrained(hf_dir)
        if arch != self.arch:
            raise ValueError(f"{hf_dir}: architecture {arch} differs from the policy's {self.arch}")
        model = build_model(self.arch, self.layout.tp_size, self.device)
        self.load_hf_weights(model, checkpoint.hf_reader(hf_dir))
        model.train()  # dropout is refused (ModelArch); train mode matches what the loss sees
        return model

    @torch.no_grad()
    def load_hf_weights(self, model: torch.nn.Module, read: Callable[[str], torch.Tensor]) -> None:
        """Copy this rank's converted shard of every parameter from the HF tensors `read(name)`."""
        params = dict(model.named_parameters())
        names = convert.megatron_names(self.arch)
        if sorted(params) != sorted(names):
            raise RuntimeError(
                f"GPTModel parameters {sorted(set(params) ^ set(names))} do not match the converter"
            )
        for name in names:
            params[name].copy_(
                convert.to_megatron(name, read, self.arch, self.layout.tp_size, self.layout.tp_rank)
            )

    # -- forward -------------------------------------------------------------------------------
    def _response_logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Temperature-scaled logits that predict each response token: [B, T, V] float32, V the HF vocab.
        Only the response rows of the vocab-parallel logits are gathered over the TP group."""
        ids = mb.input_ids.to(self.device)
        batch, length = ids.shape
        positions = torch.arange(length, device=self.device).expand(batch, length)
        logits = model(ids, positions, causal_mask(length, self.device))  # [B, S, V_padded / tp]
        idx = mb.response_index.to(self.device)[:, :, None].expand(-1, -1, logits.shape[-1])
        full = gather_vocab(logits.gather(1, idx), self.layout)
        return full[..., : self.arch.vocab_size].float() / self.s.temperature

    def _rollout(self, ref: ArtifactRef) -> list[Sample]:
        """The rollout's samples ordered by sample_index (read once per rollout, by content hash)."""
        if self._samples is None or self._samples[0] != ref.sha256:
            self._samples = (ref.sha256, sorted(read_rollout(ref), key=lambda s: s.sample_index), {})
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
        """This data-parallel rank's steps -> micro-batches -> positions (a replica's TP ranks share them)."""
        return schedule(
            len(samples),
            self.s.global_batch_size,
            self.layout.dp_size,
            self.layout.dp_rank,
            self.s.micro_batch_size,
        )

    @torch.no_grad()
    def compute_log_probs(self, rollout_ref: ArtifactRef, out_path: str) -> ArtifactRef | None:
        """Old-policy / reference log-probs and entropy per response token (global rank 0 writes).
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
                if not self.s.use_rollout_logprobs:
                    began = time.perf_counter()
                    logits = self._response_logits(self.model, mb)
                    tokens = mb.response_tokens.to(self.device)
                    lp, ent = log_probs_from_logits(logits, tokens).cpu(), entropy_from_logits(logits).cpu()
                    for i, s in enumerate(batch):
                        n = s.response_length
                        rows[s.sample_index].update(log_probs=lp[i, :n].tolist(), entropy=ent[i, :n].tolist())
                    policy_s += time.perf_counter() - began
                if self.ref_model is not None:
                    began = time.perf_counter()
                    ref = log_probs_from_logits(
                        self._response_logits(self.ref_model, mb), mb.response_tokens.to(self.device)
                    ).cpu()
                    for i, s in enumerate(batch):
                        rows[s.sample_index]["ref_log_probs"] = ref[i, : s.response_length].tolist()
                    ref_s += time.perf_counter() - began
        self._perf = {"perf/log_probs_time": policy_s, "perf/ref_log_probs_time": ref_s}
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, rows if self.layout.tp_rank == 0 else {})
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
        self._written_logprobs = (written.sha256, table.to_pylist())
        return written

    def rollout_stats(self, rollout_ref: ArtifactRef, logprob_ref: ArtifactRef) -> dict[str, float]:
        """Trainer-side `rollout/*` stats (log_probs, ref_log_probs, entropy, rollout_log_probs)."""
        return logprob_stats(self._rollout(rollout_ref), self._logprob_rows(logprob_ref))

    # -- training ------------------------------------------------------------------------------
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

    def _old_log_probs(self, samples: list[Sample], lp_rows: list[dict]) -> dict[int, dict]:
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

    def _train_rollout(
        self, samples: list[Sample], lp_rows: list[dict], dump_template: str | None
    ) -> list[dict[str, float]]:
        old = self._old_log_probs(samples, lp_rows)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        groups = torch.tensor([s.group_index for s in samples], dtype=torch.long)
        advantages = get_advantage_estimator(self.s.advantage_estimator)(
            rewards, groups, normalize_std=self.s.normalize_std
        )
        use_rollout_lp = all(len(s.rollout_log_probs) == s.response_length for s in samples)
        det = self.s.deterministic_collective
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
                    sums[k] = sums[k] + v.cpu()
            self.faults.reach("trainer_step_before_allreduce", rollout_id=samples[0].rollout_id)
            for p in self.params:
                if p.grad is None:  # every rank must join every collective
                    p.grad = torch.zeros_like(p)
            sum_grads_over_dp(self.params, self.layout, deterministic=det)
            keys = sorted(sums)
            vec = torch.stack([sums[k] for k in keys]).to(self.device)
            all_reduce_sum(vec, deterministic=det, group=self.layout.dp_group)
            grad_norm = clip_grad_norm(
                self.params,
                self.s.clip_grad if self.s.clip_grad > 0 else float("inf"),
                self.layout,
                deterministic=det,
            )
            record = {f"train/{k}": float(v) for k, v in zip(keys, vec.cpu(), strict=True)}
            record.update({"train/grad_norm": float(grad_norm), "train/step": self.global_step})
            if self.optimizer is not None and self.scheduler is not None:
                record["train/lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                self.scheduler.step()
            self.global_step += 1
            out.append(record)
        if dump_template and self.layout.tp_rank == 0:
            mine = [p for step in self._my_micro_batches(samples) for mb in step for p in mb]
            self._dump_batch(dump_template, samples, mine, advantages, old)
        return out

    def _micro_step(
        self,
        batch: list[Sample],
        mb: MicroBatch,
        adv: torch.Tensor,
        old: dict[int, dict],
        use_rollout_lp: bool,
    ) -> dict[str, torch.Tensor]:
        width, dev = mb.response_tokens.shape[1], self.device
        logits = self._response_logits(self.model, mb)
        log_probs = log_probs_from_logits(logits, mb.response_tokens.to(dev))
        if self.s.entropy_coef:
            entropy = entropy_from_logits(logits)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(logits)
        ref = (
            pad_rows([old[s.sample_index]["ref_log_probs"] for s in batch], width).to(dev)
            if self.s.use_kl_loss
            else None
        )
        rollout_lp = pad_rows([s.rollout_log_probs for s in batch], width).to(dev) if use_rollout_lp else None
        loss, metrics = policy_objective(
            log_probs,
            pad_rows([old[s.sample_index]["log_probs"] for s in batch], width).to(dev),
            adv.to(dev)[:, None].expand_as(log_probs),
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
            normaliser=float(self.s.global_batch_size),
        )
        loss.backward()
        return metrics

    def _dump_batch(
        self,
        template: str,
        samples: list[Sample],
        positions: list[int],
        advantages: torch.Tensor,
        old: dict[int, dict],
    ) -> None:
        """This replica's share of the rollout as trained: joins back to the rollout by sample_index."""
        rows = [samples[p] for p in positions]
        dp_rank = self.layout.dp_rank
        cols: dict[str, Any] = {
            "rollout_id": pa.array([s.rollout_id for s in rows], pa.int64()),
            "rank": pa.array([dp_rank] * len(rows), pa.int64()),
            "sample_index": pa.array([s.sample_index for s in rows], pa.int64()),
            "advantage": pa.array([float(advantages[p]) for p in positions], pa.float32()),
            "reward": pa.array([s.reward for s in rows], pa.float64()),
            "log_probs": pa.array([old[s.sample_index]["log_probs"] for s in rows], pa.list_(pa.float32())),
        }
        if all(old[s.sample_index].get("ref_log_probs") is not None for s in rows):
            cols["ref_log_probs"] = pa.array(
                [old[s.sample_index]["ref_log_probs"] for s in rows], pa.list_(pa.float32())
            )
        path = template.format(rollout_id=rows[0].rollout_id, rank=dp_rank)
        if not path.endswith(".parquet"):
            path = str(Path(path).with_suffix(".parquet"))
        write_table(path, pa.table(cols), kind="train_data")

    def _snapshot(self) -> _Snapshot:
        """Copies of everything a train step mutates: weights, optimizer state, LR schedule, step."""
        weights = [p.detach().clone() for p in self.params]
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
        return _Snapshot(weights, opt_state, groups, sched, self.global_step)

    @torch.no_grad()
    def _restore(self, snap: _Snapshot) -> None:
        for p, saved in zip(self.params, snap.weights, strict=True):
            p.copy_(saved)
            p.grad = None
        if self.optimizer is not None and self.scheduler is not None:
            self.optimizer.state = defaultdict(dict, snap.opt_state)
            for group, saved_group in zip(self.optimizer.param_groups, snap.groups, strict=True):
                group.update(saved_group)
            self.scheduler.load_state_dict(snap.sched)
        self.global_step = snap.global_step

    # -- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def iter_weights(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """Collective (every rank iterates it): each parameter's TP shards gathered to TP rank 0 of DP replica 0
        (global rank 0) one parameter at a time and converted to HF names there; global rank 0 yields buckets
        of about `bucket_bytes` (every weight once), the other ranks yield nothing. Rank 0 holds its shards plus
        one bucket, never a second full copy."""
        lay = self.layout
        if lay.dp_rank != 0:
            return
        params = dict(self.model.named_parameters())
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name in convert.megatron_names(self.arch):
            local = params[name].detach().contiguous()
            if lay.tp_size == 1:
                parts: list[torch.Tensor] | None = [local]
            else:
                parts = [torch.empty_like(local) for _ in range(lay.tp_size)] if lay.tp_rank == 0 else None
                dist.gather(local, parts, group=lay.tp_group, group_dst=0)
            if parts is None:
                continue
            for k, v in convert.to_hf(name, parts, self.arch).items():
                bucket[k] = v.detach().cpu().clone()
                size += v.numel() * v.element_size()
            if size >= bucket_bytes:
                yield bucket
                bucket, size = {}, 0
        if bucket:
            yield bucket

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Collective: every weight by HF name on global rank 0 ({} elsewhere)."""
        return {k: v for bucket in self.iter_weights(1 << 62) for k, v in bucket.items()}

    def weights_sha256(self) -> str:
        """Collective: artifacts.hashing.weights_sha256 of the HF weights on global rank 0 ("" elsewhere)."""
        hashes = self.tensor_hashes()
        return weights_sha256_of(hashes) if hashes else ""

    def tensor_hashes(self) -> dict[str, str]:
        """Collective: per-tensor SHA-256 of the HF weights (the engines' names), bucket by bucket, on global
        rank 0 ({} elsewhere)."""
        return {k: v for bucket in self.iter_weights(64 << 20) for k, v in tensor_hashes(bucket).items()}

    def model_hash(self) -> dict[str, str]:
        """Per-layer SHA-256 of this rank's Megatron parameters (its TP shard), miles' layout."""
        return layer_hashes({n: p for n, p in self.model.named_parameters()})

    # -- checkpoints (trainers/megatron/persistence.py) ------------------------------------------
    def save(self, directory: str, rollout_id: int, *, snapshot: bool = False) -> None:
        """Collective: write iter_{rollout_id:07d}/ (megatron distributed checkpoint + HF export, meta.json with
        the applied rollout's metrics, per-rank model hashes with --ci-save-model-hash) and the latest marker.
        `snapshot`: a step-boundary snapshot for fault recovery (no hashes, no fault hook, last two kept)."""
        persistence.save(self, directory, rollout_id, snapshot=snapshot)

    def load(self, directory: str) -> int:
        """Collective: restore a Megatron or torch-backend checkpoint (returns its rollout id), or the
        weights of a plain HF model dir (returns -1)."""
        return persistence.load(self, directory)


# mypy checks here that MegatronTrainer (constructor included) satisfies the Trainer protocol
_CHECKED: type[Trainer] = MegatronTrainer
