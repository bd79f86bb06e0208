"""Weight transfer from the trainers to the engines: one seam, the strategy chosen by the (trainer backend,
engine backend) pair (slime keeps the same choice in `update_weight_from_{tensor,distributed,disk}`).

- `FullTransfer`: rank 0 exports every weight as one object in Ray's object store; every engine fetches it and
  loads it in one call: one round trip, for small models.
- `StreamedTransfer`: every trainer rank runs `stream_weights` in step (a backend whose weights live in shards
  gathers them there). Rank 0 yields HF-named buckets of about `bucket_bytes`, in the engines' dtype, as they are
  ready. Each engine loads them as they come, then commits the version once every weight arrived. No process holds
  two full copies: rank 0 holds its shard plus a bucket, an engine its model plus a bucket. At most `in_flight`
  buckets exist at once, so the object store never holds the whole model: its shared memory stays resident in
  every process that mapped it once it was used, so a whole-model object would cost the model's size again for
  the rest of the run. In a local run (one machine) the buckets do not go through the store at all: rank 0 writes
  each into a file in shared memory and sends its WireFile, the engines map it, and the file is deleted once every
  engine has loaded it, which frees its memory (the store's pages, once used, would stay resident).
- `SizedTransfer`: the embedded torch pair's choice, FullTransfer for a model of at most `FULL_TRANSFER_BYTES` in
  float32 (the tiny recipes), else StreamedTransfer (a model of unknown size too).

Both return what was pushed: the weights' sha256 (artifacts.hashing.weights_sha256) and the per-tensor hashes,
which the weight-update checker and the engines-in-sync check compare against without moving weights again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from artifacts.hashing import weights_sha256_of
from artifacts.lint import checkpoint_numel
from config import RunConfig
from tasks import actors

# bytes per streamed bucket, counted as sent (in the engines' dtype): the store's pages stay resident once an
# object has used them, so its objects are kept small
BUCKET_BYTES = 32 << 20
# the most a FullTransfer moves in one object, counted in float32
FULL_TRANSFER_BYTES = 64 << 20
# where a local run's streamed buckets are written (tmpfs: memory, freed as each file is deleted)
SHARED_MEMORY = Path("/dev/shm")
SYNC_FILES_PREFIX = "rollflow-sync-"


@dataclass(frozen=True)
class Pushed:
    """What a transfer put into the engines."""

    sha256: str
    tensor_hashes: dict[str, str]


class WeightTransfer(Protocol):
    """A way to move the trainers' current weights into engines."""

    async def push(self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any]) -> Pushed:
        """Load the trainers' current weights into `engines` as `version`; every trainer rank takes part."""
        ...


class FullTransfer:
    """One object with every weight, fetched by every engine (see the module docstring)."""

    async def push(self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any]) -> Pushed:
        trainers = actors.trainers(cfg)
        exported = [t.export_weights.remote(ctx) for t in trainers]  # rank 0's holds the weights
        # hashed where the weights are, after the export
        hashes = [t.tensor_hashes.remote() for t in trainers]
        loads = [e.update_weights.remote([exported[0]], version, ctx) for e in engines]
        *_, tensor_hashes = await asyncio.gather(*loads, *exported[1:], *hashes[1:], hashes[0])
        return Pushed(weights_sha256_of(tensor_hashes), tensor_hashes)


class StreamedTransfer:
    """Buckets streamed from trainer rank 0 to the engines as they are gathered (see the module docstring)."""

    def __init__(self, bucket_bytes: int = BUCKET_BYTES, in_flight: int = 2) -> None:
        self.bucket_bytes, self.in_flight = bucket_bytes, in_flight

    async def push(self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any]) -> Pushed:
        files = sync_files_dir(cfg)
        try:
            return await self._push(cfg, engines, version, ctx, files)
        finally:
            if files is not None:
                shutil.rmtree(files, ignore_errors=True)  # what a failed sync left behind

    async def _push(
        self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any], files: Path | None
    ) -> Pushed:
        trainers = actors.trainers(cfg)
        # the generator pauses while `in_flight` of its buckets are not taken from the stream
        streams = [
            t.stream_weights.options(
                num_returns="streaming", _generator_backpressure_num_objects=self.in_flight
            ).remote(self.bucket_bytes, ctx, None if files is None else str(files))
            for t in trainers
        ]
        loads: list[Any] = []

        async def load(bucket: Any, index: int) -> None:
            try:
                await asyncio.gather(*[e.load_weight_bucket.remote([bucket], version, ctx) for e in engines])
            finally:
                if files is not None:  # every engine has read it: deleting it frees its memory
                    (files / f"{index}.bin").unlink(missing_ok=True)

        async def forward(stream: Any) -> None:
            index = 0
            async for bucket in stream:  # an ObjectRef per bucket: handed on, never fetched here
                loads.append(asyncio.ensure_future(load(bucket, index)))
                index += 1
                if len(loads) >= self.in_flight:  # take the next bucket once an older one is loaded
                    await loads[-self.in_flight]

        async def drain(stream: Any) -> None:
            async for ref in stream:  # the other ranks take part in the gathers and yield nothing
                await ref

        try:
            await asyncio.gather(forward(streams[0]), *[drain(s) for s in streams[1:]])
        except Exception:
            # the loads in flight end (or fail, their errors read here) before their files are deleted
            await asyncio.gather(*loads, return_exceptions=True)
            raise
        summary = await trainers[0].stream_summary.remote()
        await asyncio.gather(
            *loads, *[e.commit_weights.remote(version, summary["names"], ctx) for e in engines]
        )
        return Pushed(weights_sha256_of(summary["tensor_hashes"]), summary["tensor_hashes"])


class SizedTransfer:
    """FullTransfer for weights within one bucket, else StreamedTransfer (see the module docstring)."""

    async def push(self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any]) -> Pushed:
        nbytes = _float32_bytes(str(cfg.hf_checkpoint)) if cfg.hf_checkpoint else None
        chosen: WeightTransfer = (
            FullTransfer() if nbytes is not None and nbytes <= FULL_TRANSFER_BYTES else StreamedTransfer()
        )
        return await chosen.push(cfg, engines, version, ctx)


def sync_files_dir(cfg: RunConfig) -> Path | None:
    """A new directory in shared memory (`SHARED_MEMORY`) for one streamed sync's bucket files, named after this
    process (`rollflow-sync-<pid>-...`), when the run's Ray is local: the trainers and engines are on this machine.
    None (the buckets go through the object store) for a Ray cluster, or where there is no writable shared memory.
    The directories of processes that no longer run (a driver killed mid-sync) are removed first: shared memory is
    not freed until its files are deleted."""
    if cfg.ray_address or not os.access(SHARED_MEMORY, os.W_OK):
        return None
    for stale in SHARED_MEMORY.glob(f"{SYNC_FILES_PREFIX}*"):
        pid = sync_files_owner(stale)
        if pid is not None and not _running(pid):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SYNC_FILES_PREFIX}{os.getpid()}-", dir=SHARED_MEMORY))


def sync_files_owner(directory: Path) -> int | None:
    """The pid that made a `sync_files_dir` directory, from its name; None for a name not of that form."""
    pid = directory.name.removeprefix(SYNC_FILES_PREFIX).split("-")[0]
    return int(pid) if directory.name.startswith(SYNC_FILES_PREFIX) and pid.isdigit() else None


def _running(pid: int) -> bool:
    """Whether a process `pid` exists (any user's; /dev/shm implies Linux, and so /proc)."""
    return Path(f"/proc/{pid}").exists()


@functools.lru_cache(maxsize=8)
def _float32_bytes(checkpoint: str) -> int | None:
    """The model's weights' bytes in float32 (the most a sync moves a parameter in), from the checkpoint's
    safetensors headers; None when they do not tell (weights in another format): such a model is streamed."""
    try:
        return 4 * checkpoint_numel(Path(checkpoint))
    except (OSError, ValueError):
        return None


# (trainer backend, engine backend) -> how weights travel; a new backend pair is one line here
TRANSFERS: dict[tuple[str, str], Callable[[], WeightTransfer]] = {
    ("torch", "torch"): SizedTransfer,
    ("megatron", "torch"): StreamedTransfer,
}


def transfer_for(cfg: RunConfig) -> WeightTransfer:
    """The transfer of the run's backend pair."""
    pair = (cfg.train.train_backend, cfg.rollout.rollout_backend)
    if pair not in TRANSFERS:
        raise ValueError(
            f"no weight transfer from the {pair[0]} trainer to the {pair[1]} engine; "
            f"pairs: {sorted(TRANSFERS)}"
        )
    return TRANSFERS[pair]()


async def trainer_weights(cfg: RunConfig) -> Pushed:
    """The trainers' current weights' identity (sha256 and per-tensor hashes), every rank taking part (a sharded
    backend gathers to hash); nothing is moved to the engines."""
    hashes = await asyncio.gather(*[t.tensor_hashes.remote() for t in actors.trainers(cfg)])
    return Pushed(weights_sha256_of(hashes[0]), hashes[0])
