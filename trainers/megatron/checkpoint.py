"""Megatron-core distributed checkpoints (the `torch_dist` format) and the HF export beside them.

A checkpoint directory `iter_{id:07d}/` written by the Megatron backend holds
- megatron's distributed checkpoint: `.metadata` + `__*_*.distcp` (torch DCP shards, keyed by megatron's
  sharded keys such as `decoder.layers.self_attention.linear_qkv.weight` with layers stacked), `common.pt`
  and `metadata.json` (`{"sharded_backend": "torch_dist", ...}`); `dist_checkpointing.load` reads it back
  at any tensor-parallel size that divides the model;
- the HF export (`model.safetensors` + `config.json`), what engines, `--ref-load` and replays read;
- `tensor_hashes.json`: content hashes of the HF export's tensors and of every item stored in the shards
  (`stored_ranges`), which `--load` and `lint-ckpt` verify (artifacts/content_hashes.py);
- `meta.json` and, when asked, `model_hash_tp{t}_pp0_dp{d}_cp0.json` per rank.

Writing: megatron's own `TorchDistSaveShardedStrategy` always goes through its async writer, which forks
writer processes and calls CUDA twice (`FileSystemWriterAsync.preload_tensors` synchronises CUDA,
`save_state_dict_async_finalize` broadcasts on the current CUDA device). `SyncTorchDistSave` writes the
same format synchronously in this process with `torch.distributed.checkpoint`, using megatron's own
translation of its sharded tensors and its save planner, so the files are what megatron writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedStateDict
from megatron.core.dist_checkpointing.optimizer import (
    get_param_id_to_sharded_param_map,
    make_sharded_optimizer_tensor,
)
from megatron.core.dist_checkpointing.strategies.base import SaveShardedStrategy
from megatron.core.dist_checkpointing.strategies.torch import (
    MCoreSavePlanner,
    _replace_state_dict_keys_with_sharded_keys,
    mcore_to_pyt_state_dict,
)
from megatron.core.models.gpt import GPTModel
from safetensors import safe_open
from safetensors.torch import save_file

# the AdamW moments saved per parameter, sharded like the parameter itself
MOMENTS = ("exp_avg", "exp_avg_sq")


def moments(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The per-parameter state `optimizer` keeps beside its step count: AdamW's two moments, SGD's momentum buffer
    (none without momentum)."""
    if isinstance(optimizer, torch.optim.SGD):
        return ("momentum_buffer",) if any(g["momentum"] for g in optimizer.param_groups) else ()
    return MOMENTS


class SyncTorchDistSave(SaveShardedStrategy):
    """megatron's `torch_dist` (version 1) save, done synchronously by torch DCP in this process."""

    def __init__(self) -> None:
        super().__init__("torch_dist", 1)

    @property
    def can_handle_sharded_objects(self) -> bool:
        """ShardedObjects (per-rank RNG states) travel as DCP byte items, as in megatron's strategy."""
        return True

    def save(self, sharded_state_dict: ShardedStateDict, checkpoint_dir: str | Path) -> None:
        """Write every main-replica shard of `sharded_state_dict` under `checkpoint_dir` (collective)."""
        flat, _, _ = _replace_state_dict_keys_with_sharded_keys(
            sharded_state_dict, keep_only_main_replica=True
        )
        dcp.save(
            mcore_to_pyt_state_dict(flat, False),
            storage_writer=dcp.FileSystemWriter(str(checkpoint_dir), thread_count=1),
            planner=MCoreSavePlanner(flatten_state_dict=False),
        )


def sharded_state(
    model: GPTModel,
    optimizer: torch.optim.Optimizer | None,
    rank: int,
    world_size: int,
    *,
    for_loading: bool,
    rng: bool = True,
) -> ShardedStateDict:
    """The sharded part of a checkpoint: the model's sharded tensors, the optimizer's moments (`moments`) sharded
    like their parameters (`optimizer.state.exp_avg.<model key>`), and (with `rng`) this rank's torch RNG state, one
    object per rank of a world of `world_size` (so it only loads back into the same world size).

    `for_loading` fills the moments with empty tensors of the right shape to receive the saved ones."""
    model_sd = model.sharded_state_dict()
    out: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        sharded = get_param_id_to_sharded_param_map(model_sd, params)
        out["optimizer_state"] = {
            i: {
                k: make_sharded_optimizer_tensor(
                    sharded[i],
                    torch.empty_like(p) if for_loading else optimizer.state[p][k],
                    prefix=f"optimizer.state.{k}",
                )
                for k in moments(optimizer)
            }
            for i, p in enumerate(params)
        }
    if rng:
        out["rng_state"] = ShardedObject(
            "rng_state", torch.get_rng_state(), (world_size,), (rank,), replica_id=0
        )
    return out


def save(directory: Path, state: ShardedStateDict) -> None:
    """Collective: every rank passes its sharded state plus identical plain values (they go to
    `common.pt`); writes megatron's distributed checkpoint into the existing, empty `directory`."""
    dist_checkpointing.save(state, str(directory), sharded_strategy=SyncTorchDistSave())


def load(directory: Path, state: ShardedStateDict) -> dict[str, Any]:
    """Collective: the saved values for every sharded entry of `state` (resharded to this rank's TP
    slice) merged with the saved plain values of `common.pt`."""
    return dist_checkpointing.load(state, str(directory))


def load_common(directory: Path) -> dict[str, Any]:
    """The plain values of a distributed checkpoint (`common.pt`), without touching the shards."""
    return dist_checkpointing.load_common_state_dict(str(directory))


# small files of a distributed checkpoint that a load reads whole: hashed as one range each
_WHOLE = (".metadata", "common.pt", "metadata.json")


def stored_ranges(directory: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """{file: {item: (offset, length)}} of the distributed checkpoint in `directory`: every item DCP stored in a
    `*.distcp` shard (named by its sharded key and, for a shard of a tensor, its offset in the tensor, as DCP's
    index records them) and each of its small files whole (`*`). The shards hold pickled torch tensors, so their
    content is hashed as stored bytes per item, not per tensor value."""
    storage = dcp.FileSystemReader(str(directory)).read_metadata().storage_data
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for index, info in storage.items():
        key = index.fqn if index.offset is None else f"{index.fqn}@{list(index.offset)}"
        out.setdefault(info.relative_path, {})[key] = (info.offset, info.length)
    for name in _WHOLE:
        out[name] = {"*": (0, (directory / name).stat().st_size)}
    return out


def is_dist_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a megatron distributed checkpoint."""
    return (directory / "metadata.json").is_file() and (directory / "common.pt").is_file()


def hf_reader(directory: Path) -> Callable[[str], torch.Tensor]:
    """Reads one tensor at a time, by HF name, from `directory`'s `model.safetensors` or from the shards
    named by `model.safetensors.index.json` (so converting never holds the whole HF model)."""
    index = directory / "model.safetensors.index.json"
    files = (
        {name: directory / f for name, f in json.loads(index.read_text())["weight_map"].items()}
        if index.is_file()
        else None
    )
    handles: dict[Path, Any] = {}

    def read(name: str) -> torch.Tensor:
        file = files[name] if files is not None else directory / "model.safetensors"
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt")
        return handles[file].get_tensor(name)

    return read


def write_hf(directory: Path, tensors: dict[str, torch.Tensor], config_json: str) -> None:
    """`model.safetensors` + `config.json` into `directory`. A tensor listed twice (a tied model's
    embedding and lm_head) is stored twice, as the torch backend stores `model.state_dict()`."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.detach().clone().contiguous() if ptr in seen else t.detach().contiguous()
        seen.add(ptr)
    save_file(out, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(config_json)
