"""tasks/transfer.py: which transfer a backend pair and a model size get, and that a streamed sync keeps at most
`in_flight` buckets between the trainer and the engines (the object store never holds the whole model); in a local
run the buckets travel as files in shared memory, each deleted once every engine loaded it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from artifacts.wire import WireFile, read_file, write_file
from tasks import transfer


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn, self.opts = fn, {}

    def options(self, **opts: Any) -> _Method:
        self.opts = opts
        return self

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class _Trainer:
    """Rank 0 streaming `n` buckets; `state` counts the buckets made and not yet loaded by every engine."""

    def __init__(self, n: int, state: dict[str, int]) -> None:
        self.n, self.state = n, state

        async def stream(bucket_bytes: int, ctx: dict, files: str | None) -> Any:
            for i in range(self.n):
                # Ray's backpressure: the generator waits while `in_flight` of its buckets are not taken
                self.state["made"] += 1
                self.state["peak"] = max(self.state["peak"], self.state["made"] - self.state["loaded"])
                if files is None:
                    yield f"bucket-{i}"
                else:
                    yield write_file({f"w{i}": torch.full((3,), float(i))}, Path(files) / f"{i}.bin")
                    self.state["files"] = max(self.state.get("files", 0), len(list(Path(files).iterdir())))

        async def summary() -> dict:
            return {
                "names": [f"w{i}" for i in range(self.n)],
                "tensor_hashes": {f"w{i}": "0" * 64 for i in range(self.n)},
            }

        self.stream_weights = _Method(stream)
        self.stream_summary = _Method(summary)


class _Engine:
    def __init__(self, state: dict[str, int], loaded: list[str]) -> None:
        async def load(bucket: list[Any], version: int, ctx: dict) -> None:
            await asyncio.sleep(0.01)  # a load takes longer than making a bucket
            if isinstance(bucket[0], WireFile):
                (name, value), *_ = read_file(bucket[0]).items()
                loaded.append(f"bucket-{int(value[0])}")
            else:
                loaded.append(bucket[0])

        async def commit(version: int, names: list[str], ctx: dict) -> None:
            state["committed"] = len(loaded)

        self.load_weight_bucket = _Method(load)
        self.commit_weights = _Method(commit)


@pytest.mark.parametrize("ray_address", ["ray://cluster:10001", None], ids=["object-store", "local-files"])
def test_a_streamed_sync_keeps_at_most_in_flight_buckets_and_commits_after_every_load(
    monkeypatch, tmp_path, ray_address
):
    monkeypatch.setattr(transfer, "SHARED_MEMORY", tmp_path)
    state = {"made": 0, "loaded": 0, "peak": 0}
    loaded: list[str] = []
    engines = [_Engine(state, loaded)]
    trainer = _Trainer(12, state)

    def counting_load(orig: Any) -> Any:
        async def load(*args: Any) -> None:
            await orig(*args)
            state["loaded"] += 1

        return load

    engines[0].load_weight_bucket.fn = counting_load(engines[0].load_weight_bucket.fn)
    monkeypatch.setattr(transfer.actors, "trainers", lambda cfg: [trainer])
    cfg = SimpleNamespace(ray_address=ray_address)
    pushed = asyncio.run(transfer.StreamedTransfer(in_flight=2).push(cfg, engines, 3, {}))
    assert loaded == [f"bucket-{i}" for i in range(12)] and state["committed"] == 12
    assert trainer.stream_weights.opts["_generator_backpressure_num_objects"] == 2
    assert state["peak"] <= 2  # never more than in_flight buckets made and not loaded
    assert len(pushed.tensor_hashes) == 12
    if ray_address is None:  # each file deleted once loaded: at most in_flight (+ the one being made) at once
        assert 1 <= state["files"] <= 3
    assert list(tmp_path.iterdir()) == []  # nothing left in shared memory


def test_a_failed_local_sync_leaves_no_files(monkeypatch, tmp_path):
    monkeypatch.setattr(transfer, "SHARED_MEMORY", tmp_path)
    state = {"made": 0, "loaded": 0, "peak": 0}
    engine = _Engine(state, [])

    async def broken(bucket: list[Any], version: int, ctx: dict) -> None:
        raise RuntimeError("the engine died while loading")

    engine.load_weight_bucket.fn = broken
    monkeypatch.setattr(transfer.actors, "trainers", lambda cfg: [_Trainer(5, state)])
    with pytest.raises(RuntimeError, match="died while loading"):
        asyncio.run(transfer.StreamedTransfer().push(SimpleNamespace(ray_address=None), [engine], 1, {}))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("params", "chosen"),
    [
        (3_000_000, transfer.FullTransfer),
        (50_000_000, transfer.StreamedTransfer),
        (None, transfer.StreamedTransfer),
    ],
    ids=["3M", "50M", "no-safetensors"],
)
def test_the_torch_pair_streams_a_model_larger_than_one_bucket(monkeypatch, params, chosen):
    """A model over 64 MiB in float32 is streamed, and so is one whose size its checkpoint's headers do not
    tell (weights in another format): streaming bounds the memory of any size."""
    used = []

    def numel(path: Any) -> int:
        if params is None:
            raise ValueError(f"{path}: no safetensors weights")
        return params

    async def push(self: Any, cfg: Any, engines: Any, version: int, ctx: Any) -> str:
        used.append(type(self))
        return "pushed"

    for cls in (transfer.FullTransfer, transfer.StreamedTransfer):
        monkeypatch.setattr(cls, "push", push)
    monkeypatch.setattr(transfer, "checkpoint_numel", numel)
    transfer._float32_bytes.cache_clear()
    cfg = SimpleNamespace(
        hf_checkpoint=f"/models/m{params}",
        train=SimpleNamespace(train_backend="torch"),
        rollout=SimpleNamespace(rollout_backend="torch"),
    )
    assert asyncio.run(transfer.transfer_for(cfg).push(cfg, [], 1, {})) == "pushed"
    assert used == [chosen]


def test_a_local_sync_removes_the_files_a_killed_driver_left(monkeypatch, tmp_path):
    import os
    import subprocess
    import sys

    monkeypatch.setattr(transfer, "SHARED_MEMORY", tmp_path)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = tmp_path / f"{transfer.SYNC_FILES_PREFIX}{gone.stdout.strip()}-x"  # its process has ended
    live = tmp_path / f"{transfer.SYNC_FILES_PREFIX}{os.getppid()}-y"  # a running process's sync
    for d in (left, live):
        d.mkdir()
        (d / "0.bin").write_bytes(b"w")
    made = transfer.sync_files_dir(SimpleNamespace(ray_address=None))
    assert (
        made is not None and made.parent == tmp_path and made.name.startswith(f"rollflow-sync-{os.getpid()}-")
    )
    assert not left.exists() and (live / "0.bin").exists()
    assert transfer.sync_files_dir(SimpleNamespace(ray_address="ray://cluster:10001")) is None
