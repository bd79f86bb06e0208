"""The Megatron-core trainer: megatron's GPTModel, tensor parallel within a model replica and data parallel
across replicas, over gloo on the CPU (nccl on CUDA).

Same semantics as the torch backend (trainers/torch_trainer/trainer.py), which it must match within
float32 rounding on the same HF checkpoint and rollout: the same micro-batch schedule (trainers.batching),
right-padded sequences with a causal mask, temperature-scaled logits, the shared loss and advantage
functions, the loss normaliser (the global batch size), AdamW with the shared LR schedule, clipping by the
global grad norm, the apply-once guard, and a snapshot restored when a step fails. Those shared duties are
trainers/core.py's TrainerCore; this file is the Megatron model, its TP/DP layout and collectives, and the
gather of its shards to HF names (checkpoints: trainers/megatron/persistence.py).

Ranks: TP groups are consecutive ranks, DP rank = rank // TP. Every TP rank of a replica computes the same
loss from logits gathered over the vocab (only the response rows are gathered); gradients are summed over
the DP group, deterministically with --debug-deterministic-collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from artifacts.checkpoints import model_dir
from artifacts.hashing import layer_hashes, tensor_hashes, weights_sha256_of
from trainers.base import Trainer
from trainers.batching import MicroBatch
from trainers.collectives import init_method
from trainers.core import TrainerCore, buckets, copy_as
from trainers.megatron import checkpoint, convert, persistence
from trainers.megatron.arch import ModelArch
from trainers.megatron.model import Memory, build_model, causal_mask, init_parallel
from trainers.megatron.parallel import (
    Layout,
    clip_grad_norm,
    gather_vocab,
    sum_grads_over_dp,
    sum_partial_grads_over_tp,
)
from trainers.settings import TrainerSettings


class MegatronTrainer(TrainerCore):
    """Implements `trainers.base.Trainer` on megatron-core for HF Qwen2/Qwen3/Llama checkpoints."""

    def __init__(
        self,
        settings: TrainerSettings,
        checkpoint: str,
        rank: int,
        world_size: int,
        device: str | None = None,
    ) -> None:
        """`device`: "cpu", "cuda" or None = CUDA when available (one GPU per rank: rank % device count)."""
        kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device("cuda", rank % torch.cuda.device_count()) if kind == "cuda" else torch.device(kind)
        super().__init__(settings, checkpoint, rank, world_size, dev)

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
        if self._wants_ref_model():
            self.ref_model = self._build(
                model_dir(self.s.ref_load) if self.s.ref_load else Path(self.checkpoint)
            )
            self.ref_model.requires_grad_(False)
        self.params = list(self.model.parameters())
        self.head_local = [p for n, p in self.model.named_parameters() if convert.head_local(n)]
        self._build_optimizer()
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
        s = self.s
        memory = Memory(
            s.recompute_granularity, s.recompute_method, s.recompute_num_layers, s.deterministic_mode
        )
        model = build_model(self.arch, self.layout.tp_size, self.device, memory)
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

    # -- where this rank stands: TP groups are consecutive ranks, DP runs across them ----------------
    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def dp_size(self) -> int:
        return self.layout.dp_size

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return self.layout.dp_group

    @property
    def replica_lead(self) -> bool:
        return self.layout.tp_rank == 0  # every TP rank computes the same logits, so TP rank 0 speaks

    def _sum_grads(self) -> None:
        det = self.s.deterministic_collective
        sum_partial_grads_over_tp(self.head_local, self.layout, deterministic=det)
        sum_grads_over_dp(self.params, self.layout, deterministic=det)

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        det = self.s.deterministic_collective
        return clip_grad_norm(self.params, max_norm, self.layout, deterministic=det)

    def _state_tensors(self) -> list[torch.Tensor]:
        return list(self.params)  # what a step changes (the buffers a GPTModel has are fixed)

    # -- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def iter_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Collective (every rank iterates it): each parameter's TP shards gathered to TP rank 0 of DP replica 0
        (global rank 0) one parameter at a time and converted to HF names there; global rank 0 yields buckets
        of about `bucket_bytes` (every weight once), the other ranks yield nothing. Rank 0 holds its shards plus
        one bucket, never a second full copy. `dtype`: the floating ones cast to it as each is copied."""
        if self.layout.dp_rank == 0:
            yield from buckets(self._hf_tensors(dtype), bucket_bytes)

    def _hf_tensors(self, dtype: torch.dtype | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Collective over the TP group: per parameter, its HF tensors as CPU copies (in `dtype` when given) on TP
        rank 0 (the other TP ranks send their shards and yield nothing)."""
        lay = self.layout
        params = dict(self.model.named_parameters())
        for name in convert.megatron_names(self.arch):
            local = params[name].detach().contiguous()
            if lay.tp_size == 1:
                parts: list[torch.Tensor] | None = [local]
            else:
                parts = [torch.empty_like(local) for _ in range(lay.tp_size)] if lay.tp_rank == 0 else None
                dist.gather(local, parts, group=lay.tp_group, group_dst=0)
            if parts is not None:
                yield {k: copy_as(v, dtype) for k, v in convert.to_hf(name, parts, self.arch).items()}

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Collective: every weight by HF name on global rank 0 ({} elsewhere), the floating ones in `dtype` when
        given."""
        return {k: v for bucket in self.iter_weights(1 << 62, dtype) for k, v in bucket.items()}

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
