"""Weight transfer from the trainers to the engines: one seam, the strategy chosen by the (trainer backend,
engine backend) pair (slime keeps the same choice in `update_weight_from_{tensor,distributed,disk}`).

- `FullTransfer`: rank 0 exports every weight as one object in Ray's object store; every engine fetches it and
  loads it in one call. The embedded torch pair's path: the tiny models it runs cost one round trip.
- `StreamedTransfer`: every trainer rank runs `stream_weights` in step (a backend whose weights live in shards
  gathers them there). Rank 0 yields HF-named buckets of about `bucket_bytes` as they are ready. Each engine
  loads them as they come, then commits the version once every weight arrived. No process holds two full
  copies: rank 0 holds its shard plus one bucket, an engine its model plus one bucket.

Both return what was pushed: the weights' sha256 (artifacts.hashing.weights_sha256) and the per-tensor hashes,
which the weight-update checker and the engines-in-sync check compare against without moving weights again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from artifacts.hashing import weights_sha256_of
from config import RunConfig
from tasks import actors


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

    def __init__(self, bucket_bytes: int = 64 << 20) -> None:
        self.bucket_bytes = bucket_bytes

    async def push(self, cfg: RunConfig, engines: list[Any], version: int, ctx: dict[str, Any]) -> Pushed:
        trainers = actors.trainers(cfg)
        streams = [
            t.stream_weights.options(num_returns="streaming").remote(self.bucket_bytes, ctx) for t in trainers
        ]
        loads: list[Any] = []

        async def forward(stream: Any) -> None:
            async for bucket in stream:  # an ObjectRef per bucket: handed on, never fetched here
                loads.extend(e.load_weight_bucket.remote([bucket], version, ctx) for e in engines)

        async def drain(stream: Any) -> None:
            async for ref in stream:  # the other ranks take part in the gathers and yield nothing
                await ref

        await asyncio.gather(forward(streams[0]), *[drain(s) for s in streams[1:]])
        summary = await trainers[0].stream_summary.remote()
        await asyncio.gather(
            *loads, *[e.commit_weights.remote(version, summary["names"], ctx) for e in engines]
        )
        return Pushed(weights_sha256_of(summary["tensor_hashes"]), summary["tensor_hashes"])


# (trainer backend, engine backend) -> how weights travel; a new backend pair is one line here
TRANSFERS: dict[tuple[str, str], type[FullTransfer] | type[StreamedTransfer]] = {
    ("torch", "torch"): FullTransfer,
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
