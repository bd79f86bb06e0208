"""Saving and loading the Megatron trainer, kept apart from its training code (functions of the trainer).

`save` writes megatron's distributed checkpoint plus the HF export into one `iter_{id:07d}/` (see
trainers/megatron/checkpoint.py); `load` restores that, a torch-backend checkpoint (HF weights with
AdamW state by HF name, converted), or the weights of a plain HF model dir. Both are collective: every
rank of the trainer world calls them together.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from artifacts import content_hashes
from artifacts.atomic import atomic_write_json
from artifacts.checkpoints import resolve_checkpoint
from trainers.megatron import checkpoint, convert

if TYPE_CHECKING:
    from trainers.megatron.trainer import MegatronTrainer


def save(trainer: MegatronTrainer, directory: str, rollout_id: int, *, snapshot: bool = False) -> None:
    """Collective: write iter_{rollout_id:07d}/ with megatron's distributed checkpoint (model, AdamW
    moments, per-rank RNG; step, schedule and ids in common.pt), the HF export, meta.json (with the run id and
    the applied rollout's metrics) and, with --ci-save-model-hash, each rank's model_hash_tp{t}_pp0_dp{d}_cp0.json;
    then the latest marker. `snapshot`: a step-boundary snapshot (no hashes, no fault hook, the last two kept)."""
    hashes = trainer.model_hash() if trainer.s.save_model_hash and not snapshot else None
    final = Path(directory) / f"iter_{rollout_id:07d}"
    name = [f"{final.name}.tmp-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(name, src=0)  # every rank writes into the same temporary directory
    tmp = final.with_name(name[0])
    if trainer.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    state = checkpoint.sharded_state(
        trainer.model, trainer.optimizer, trainer.rank, trainer.world_size, for_loading=False
    )
    state.update(_common_state(trainer, rollout_id))
    checkpoint.save(tmp, state)
    if hashes is not None:
        atomic_write_json(
            tmp / f"model_hash_tp{trainer.layout.tp_rank}_pp0_dp{trainer.layout.dp_rank}_cp0.json", hashes
        )
    exported = trainer.export_weights()  # collective: the HF weights gathered on global rank 0
    if trainer.rank == 0:
        checkpoint.write_hf(tmp, exported, trainer.config_json)
        if not snapshot:  # what --load and lint-ckpt verify the files' content against
            content_hashes.record(tmp, {"model.safetensors": exported}, checkpoint.stored_ranges(tmp))
        atomic_write_json(tmp / "meta.json", trainer._checkpoint_meta(rollout_id, format="megatron"))
    dist.barrier()
    if trainer.rank == 0:
        trainer._publish_checkpoint(tmp, directory, rollout_id, snapshot=snapshot)
    dist.barrier()  # no rank returns before the checkpoint is in place


def _common_state(trainer: MegatronTrainer, rollout_id: int) -> dict[str, Any]:
    """The plain values of a checkpoint (identical on every rank; megatron puts them in common.pt)."""
    sched = trainer.scheduler.state_dict() if trainer.scheduler is not None else {}
    step = None
    if trainer.optimizer is not None and trainer.optimizer.state:
        first = next(iter(trainer.optimizer.state.values()))
        # AdamW steps every parameter; SGD counts no steps (its momentum buffers say it has stepped)
        step = float(first["step"]) if "step" in first else 0.0
    return {
        "rollout_id": rollout_id,
        "iteration": trainer.global_step,
        "global_step": trainer.global_step,
        "world_size": trainer.world_size,
        "tensor_model_parallel_size": trainer.layout.tp_size,
        "has_optimizer": trainer.optimizer is not None,
        "optimizer_step": step,
        "optimizer_moments": list(checkpoint.moments(trainer.optimizer)) if trainer.optimizer else [],
        "scheduler": {k: v for k, v in sched.items() if k != "lr_lambdas"},
    }


def load(trainer: MegatronTrainer, directory: str) -> int:
    """Collective. Restore a checkpoint: the latest one of a --save dir, or an iter_ dir, in the Megatron
    format (any TP size) or the torch backend's (HF weights + optimizer in HF names); returns its
    rollout id. A plain HF model dir sets the weights only and returns -1 (no rollout applied)."""
    path = Path(directory)
    if (path / "config.json").is_file() and not (path / "meta.json").is_file():
        trainer.load_hf_weights(trainer.model, checkpoint.hf_reader(path))
        trainer.applied, trainer.last_applied_rollout = {}, -1
        return -1
    path = resolve_checkpoint(directory)
    if trainer.s.verify_checkpoint:
        _verify_content(trainer, path)
    if checkpoint.is_dist_checkpoint(path):
        _load_dist(trainer, path)
    else:
        _load_torch_format(trainer, path)
    if trainer.s.check_model_hash:
        _check_model_hash(trainer, path)
    return trainer._restore_meta(path)


def _verify_content(trainer: MegatronTrainer, path: Path) -> None:
    """Collective: rank 0 re-hashes the checkpoint's files (megatron loads the shards itself, so the check reads
    them once more) against the content hashes its save recorded; every rank raises the first difference."""
    found = [content_hashes.verify(path) if trainer.rank == 0 else None]
    dist.broadcast_object_list(found, src=0)
    if found[0]:
        file, problem = found[0][0]
        raise ValueError(f"--load {path}: {file}: {problem} ({content_hashes.CHANGED})")


def _load_dist(trainer: MegatronTrainer, path: Path) -> None:
    common = checkpoint.load_common(path)
    with_opt = (
        trainer.optimizer is not None
        and bool(common["has_optimizer"])
        and common["optimizer_step"] is not None
    )
    same_world = (
        common["world_size"] == trainer.world_size
    )  # per-rank RNG states only map onto the same ranks
    state = checkpoint.sharded_state(
        trainer.model,
        trainer.optimizer if with_opt else None,
        trainer.rank,
        trainer.world_size,
        for_loading=True,
        rng=same_world,
    )
    if with_opt and trainer.optimizer is not None:
        saved = common.get("optimizer_moments", list(checkpoint.MOMENTS))  # older checkpoints: AdamW's
        if saved != list(checkpoint.moments(trainer.optimizer)):
            raise ValueError(
                f"{path}: its optimizer state is {saved or 'none'}, this run's optimizer keeps "
                f"{list(checkpoint.moments(trainer.optimizer)) or 'none'}: resume with the --optimizer (and "
                "--sgd-momentum) it was saved with"
            )
    got = checkpoint.load(path, state)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            p.copy_(got["model"][name])
    if with_opt and trainer.optimizer is not None:
        step = torch.tensor(common["optimizer_step"], dtype=torch.float32)
        counted = not isinstance(trainer.optimizer, torch.optim.SGD)  # AdamW's state holds its step
        trainer._set_optimizer_state(
            {
                i: {**({"step": step.clone()} if counted else {}), **moments}
                for i, moments in got["optimizer_state"].items()
            }
        )
    trainer._set_scheduler_state(common["scheduler"])
    if same_world:
        torch.set_rng_state(got["rng_state"])


def _load_torch_format(trainer: MegatronTrainer, path: Path) -> None:
    """A torch-backend checkpoint: HF weights, AdamW state keyed `{hf name}::{field}`, scheduler, RNG."""
    trainer.load_hf_weights(trainer.model, checkpoint.hf_reader(path))
    opt = load_file(str(path / "optimizer.safetensors")) if (path / "optimizer.safetensors").is_file() else {}
    if opt and trainer.optimizer is not None:
        tp, tp_rank, state = trainer.layout.tp_size, trainer.layout.tp_rank, {}
        by_field: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)  # field -> HF name -> tensor
        for key, value in opt.items():
            hf_name, _, field = key.partition("::")
            by_field[field][hf_name] = value
        for i, (name, _) in enumerate(trainer.model.named_parameters()):  # the order of trainer.params
            first = convert.hf_sources(name, trainer.arch)[0][0]
            state[i] = {"step": by_field["step"][first].clone()} if "step" in by_field else {}
            for field in checkpoint.moments(trainer.optimizer):
                state[i][field] = convert.to_megatron(
                    name, by_field[field].__getitem__, trainer.arch, tp, tp_rank
                )
        trainer._set_optimizer_state(state)
    trainer._set_scheduler_state(json.loads((path / "scheduler.json").read_text()))
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_rng"])


def _check_model_hash(trainer: MegatronTrainer, path: Path) -> None:
    """--ci-check-model-hash: this rank's loaded shard must match the hashes saved for its (tp, dp)."""
    tp_rank, dp_rank = trainer.layout.tp_rank, trainer.layout.dp_rank
    trainer._check_model_hash(
        path,
        f"model_hash_tp{tp_rank}_pp0_dp{dp_rank}_cp0.json",
        fallback=f"model_hash_tp{tp_rank}_pp0_dp0_cp0.json",
        hint=" and the same --tensor-model-parallel-size",
    )
