"""--optimizer-offload-dir (trainers/offload.py): AdamW's moments live in a file on disk, leave memory after every
use, and train bitwise as moments held in memory do, through a chunked step, a failed step's restore, a checkpoint's
save and load; a directory in memory and the optimizers or backends it cannot serve are refused by name."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from config import RunConfig
from tests.helpers import fail_second_scheduler_step
from tests.unit.test_engine_trainer import _config, _rollout, _trainer, engine  # noqa: F401 (a fixture)
from trainers import offload
from trainers.offload import DiskMoments, filesystem_of


def _resident_kib(moments: DiskMoments | None) -> int:
    """Resident KiB of the mapping of `moments`' file (this process's own: /proc/self/smaps)."""
    assert moments is not None
    start, inside = moments._flat.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-[0-9a-f]+ ", line)
        if head:
            inside = int(head.group(1), 16) == start
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    raise AssertionError("the moments' file is not mapped")


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (300, 40), (40,), (7, 3)]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _adamw(params: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    groups = [{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.99), fused=True)


def test_a_chunked_step_from_disk_trains_bitwise_as_one_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(offload, "CHUNK_BYTES", 4096)  # several chunks, one parameter larger than a chunk
    plain, on_disk = _params(), _params()
    opt, opt_disk = _adamw(plain), _adamw(on_disk)
    moments = DiskMoments(str(tmp_path), on_disk, rank=0)
    assert len(moments._chunks) >= 3 and not list(tmp_path.iterdir())  # the file is deleted once mapped
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        for a, b in zip(plain, on_disk, strict=True):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        moments.step(opt_disk)
        assert _resident_kib(moments) == 0  # every chunk left memory after its update
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain, on_disk, strict=True))  # grads kept
    for i, (a, b) in enumerate(zip(plain, on_disk, strict=True)):
        assert torch.equal(a, b)
        m, v = moments.views(i)
        state = opt_disk.state[b]
        assert state["exp_avg"].data_ptr() == m.data_ptr() and state["exp_avg_sq"].data_ptr() == v.data_ptr()
        assert torch.equal(opt.state[a]["exp_avg"], m) and torch.equal(opt.state[a]["exp_avg_sq"], v)
        assert (
            torch.equal(opt.state[a]["step"], state["step"])
            and opt.state[a]["step"].dtype == state["step"].dtype
        )
    assert _resident_kib(moments) > 0  # reading them brought pages back ...
    moments.drop()
    assert _resident_kib(moments) == 0  # ... which a drop writes out and lets go


def test_moments_a_load_brings_move_into_the_file_with_their_values(tmp_path):
    params = _params()
    opt = _adamw(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    saved = opt.state_dict()
    fresh = _params()
    opt_fresh = _adamw(fresh)
    moments = DiskMoments(str(tmp_path), fresh, rank=0)
    opt_fresh.load_state_dict(saved)
    moments.adopt(opt_fresh)
    assert _resident_kib(moments) == 0
    for i, p in enumerate(fresh):
        m, v = moments.views(i)
        assert opt_fresh.state[p]["exp_avg"].data_ptr() == m.data_ptr()
        assert torch.equal(m, saved["state"][i]["exp_avg"]) and torch.equal(
            v, saved["state"][i]["exp_avg_sq"]
        )


def test_a_directory_in_memory_is_refused(tmp_path, monkeypatch):
    assert (
        filesystem_of(Path("/proc/self")) == "proc"
    )  # the mount point closest above the path names the type
    monkeypatch.setattr(offload, "filesystem_of", lambda where: "tmpfs")
    with pytest.raises(ValueError, match=rf"--optimizer-offload-dir {tmp_path}: it is on tmpfs"):
        DiskMoments(str(tmp_path), _params(), rank=0)


def test_the_flag_is_refused_where_it_has_nothing_to_move(tmp_path):
    def config(**train) -> RunConfig:
        return RunConfig.model_validate({"train": {"optimizer_offload_dir": str(tmp_path), **train}})

    assert config().train.optimizer_offload_dir == str(tmp_path)
    with pytest.raises(ValidationError, match="--optimizer sgd has none to move"):
        config(optimizer="sgd")
    with pytest.raises(ValidationError, match="is the torch trainer's"):
        config(train_backend="megatron")


def test_a_trainer_with_its_moments_on_disk_trains_saves_loads_and_restores_bitwise(
    engine,  # noqa: F811 (the fixture imported above)
    base_checkpoint,
    tmp_path,
):
    cfg = _config(base_checkpoint, tmp_path)
    disk = _config(base_checkpoint, tmp_path, optimizer_offload_dir=str(tmp_path / "moments"))
    _, first = _rollout(engine, cfg, tmp_path)
    plain, offloaded = _trainer(cfg, base_checkpoint), _trainer(disk, base_checkpoint)
    assert plain._moments is None and offloaded._moments is not None
    expected = plain.train_step(first, plain.compute_log_probs(first, str(tmp_path / "lp0.parquet")))
    got = offloaded.train_step(first, offloaded.compute_log_probs(first, str(tmp_path / "lp1.parquet")))
    assert got == expected and _resident_kib(offloaded._moments) == 0

    def same_state(a, b) -> bool:
        weights = all(torch.equal(a.export_weights()[k], v) for k, v in b.export_weights().items())
        sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
        return weights and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])

    assert same_state(plain, offloaded)
    offloaded.save(str(tmp_path / "save"), 0)
    assert _resident_kib(offloaded._moments) == 0  # the save read them, and let them go again
    reloaded = _trainer(disk, base_checkpoint)
    reloaded.load(str(tmp_path / "save"))
    assert _resident_kib(reloaded._moments) == 0 and same_state(plain, reloaded)

    # a step that fails after its first optimizer step is put back and retried, from the moments' file too
    _, second = _rollout(engine, cfg, tmp_path, rollout_id=1)
    expected = plain.train_step(second, plain.compute_log_probs(second, str(tmp_path / "lp2.parquet")))
    lp = reloaded.compute_log_probs(second, str(tmp_path / "lp3.parquet"))
    restore_step = fail_second_scheduler_step(reloaded)
    with pytest.raises(RuntimeError, match="planted failure"):
        reloaded.train_step(second, lp)
    restore_step()
    assert reloaded.train_step(second, lp) == expected and same_state(plain, reloaded)


def test_a_save_reads_the_moments_one_tensor_at_a_time(tmp_path):
    from safetensors.torch import load_file

    from artifacts.safetensors_stream import write_safetensors

    params = [torch.nn.Parameter(torch.zeros(1 << 20)) for _ in range(16)]  # 16 x 2 moments of 4 MiB
    opt = torch.optim.AdamW(params, fused=True)
    moments = DiskMoments(str(tmp_path / "moments"), params, rank=0)
    for p in params:
        p.grad = torch.ones_like(p)
    moments.step(opt)
    named = {f"{i}::{k}": opt.state[p][k] for i, p in enumerate(params) for k in ("exp_avg", "exp_avg_sq")}
    most = 0

    class Watched(Mapping):  # what is resident as each tensor is asked for, before the one read last goes
        def __init__(self, inner):
            self.inner = inner

        def __getitem__(self, name):
            nonlocal most
            most = max(most, _resident_kib(moments))
            return self.inner[name]

        def __iter__(self):
            return iter(self.inner)

        def __len__(self):
            return len(self.inner)

    write_safetensors(tmp_path / "optimizer.safetensors", Watched(moments.reading(named)))
    # one 4 MiB moment at a time, and what the kernel reads ahead: far from the 128 MiB of all of them
    assert 0 < most <= 32 << 10, most
    back = load_file(str(tmp_path / "optimizer.safetensors"))
    assert back.keys() == named.keys() and all(torch.equal(back[k], named[k]) for k in named)


def test_a_streamed_safetensors_file_reads_back_as_saved(tmp_path):
    from safetensors.torch import load_file

    from artifacts.lint import read_safetensors_header
    from artifacts.safetensors_stream import write_safetensors

    named = {
        "w": torch.randn(3, 5),
        "b16": torch.randn(7).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "step": torch.tensor(3.0),
        "ids": torch.arange(4, dtype=torch.int64)[::2],  # not contiguous
        "none": torch.zeros(0, 4),
    }
    write_safetensors(tmp_path / "t.safetensors", named, metadata={"format": "pt"})
    back = load_file(str(tmp_path / "t.safetensors"))
    assert back.keys() == named.keys()
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in named.items())
    assert read_safetensors_header(tmp_path / "t.safetensors")[1] == []
    with pytest.raises(FileExistsError):  # never over a file there
        write_safetensors(tmp_path / "t.safetensors", named)
    with pytest.raises(ValueError, match="tensor c is torch.complex64"):
        write_safetensors(tmp_path / "c.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)})
