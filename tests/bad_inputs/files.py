"""Files and directories to break: hostile rollout files (`HOSTILE_FILES`), hand-made run dirs, --load and --save
dirs with one part broken, and `inspect` cases of a hostile file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.bad_inputs.common import Case


def good_rollout(tmp: Path) -> Path:
    """A valid rollout Parquet (the thing the hostile variants start from)."""
    from artifacts.store import write_rollout
    from tests.helpers import make_sample

    path = tmp / "good" / "rollout_0.parquet"
    if not path.is_file():
        write_rollout(path, [make_sample(i) for i in range(4)])
    return path


def _hostile(name: str, make: Callable[[Path, Path], None]) -> Callable[[Path], Path]:
    """A file `name` in tmp, made by `make(good_rollout, target)`."""

    def build(tmp: Path) -> Path:
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        make(good_rollout(tmp), target)
        return target

    return build


def _write(data: bytes) -> Callable[[Path, Path], None]:
    return lambda good, target: target.write_bytes(data)


def _truncate(good: Path, target: Path) -> None:
    data = good.read_bytes()
    target.write_bytes(data[: len(data) // 2])


def _consistent(table: pa.Table, template: pa.Table, target: Path) -> None:
    """Write `table` with the template's metadata and a content checksum that matches: a file whose checksum
    holds, so that only the reader's schema checks can catch what is wrong with it."""
    from artifacts.store import table_content_sha256

    meta = dict(template.schema.metadata or {})
    key = next(k for k in meta if k.endswith(b"content_sha256"))
    meta[key] = (
        json.dumps(table_content_sha256(table)).encode()
        if meta[key].startswith(b'"')
        else table_content_sha256(table).encode()
    )
    pq.write_table(table.replace_schema_metadata(meta), target)


def _retype(good: Path, target: Path) -> None:  # reward as text: a column of the wrong type
    table = pq.read_table(good)
    i = table.schema.get_field_index("reward")
    _consistent(
        table.set_column(i, "reward", pa.array([str(v) for v in table.column(i).to_pylist()])), table, target
    )


def _drop_column(good: Path, target: Path) -> None:
    table = pq.read_table(good)
    _consistent(table.drop_columns(["response_tokens"]), table, target)


def _tamper(good: Path, target: Path) -> None:  # content changed, checksum in the metadata kept
    table = pq.read_table(good)
    i = table.schema.get_field_index("reward")
    changed = table.set_column(i, "reward", pa.array([9.0] * table.num_rows))
    pq.write_table(changed.replace_schema_metadata(table.schema.metadata), target)


def _future(good: Path, target: Path) -> None:
    table = pq.read_table(good)
    meta = dict(table.schema.metadata or {})
    key = next(k for k in meta if b"version" in k)
    meta[key] = b"999"
    pq.write_table(table.replace_schema_metadata(meta), target)


def _pickle_code(good: Path, target: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):  # noqa: D105 - the point of the file: unpickling it runs code
            return (print, ("pwned",))

    with open(target, "wb") as f:
        pickle.dump({"rollout_id": 0, "samples": [Evil()]}, f)


def _pt_no_samples(good: Path, target: Path) -> None:
    import torch

    torch.save({"rollout_id": 0, "metadata": {}}, target)


def _mismatched_lists(good: Path, target: Path) -> None:  # loss_mask shorter than the response
    table = pq.read_table(good)
    i = table.schema.get_field_index("loss_mask")
    short = pa.array([m[:-1] for m in table.column(i).to_pylist()], pa.list_(pa.int8()))
    _consistent(table.set_column(i, "loss_mask", short), table, target)


def _declared_tokens(tokens: int, rows: int) -> Callable[[Path, Path], None]:
    """A rollout of `rows` samples whose response_tokens hold `tokens` zeros in all: a few KB on disk that
    declare them in the footer (the content checksum is not updated: the footer alone must refuse it)."""

    def make(good: Path, target: Path) -> None:
        import numpy as np

        table = pq.read_table(good)
        table = pa.concat_tables([table] * (rows // table.num_rows + 1)).slice(0, rows)
        cuts = [tokens * i // rows for i in range(rows + 1)]
        values = pa.array(np.zeros(tokens, np.int32))
        column = pa.ListArray.from_arrays(pa.array(cuts, pa.int32()), values)
        i = table.schema.get_field_index("response_tokens")
        pq.write_table(table.set_column(i, "response_tokens", column), target, compression="zstd")

    return make


HOSTILE_FILES: dict[str, tuple[str, Callable[[Path], Path]]] = {
    "empty.parquet": ("an empty file", _hostile("h/empty.parquet", _write(b""))),
    "noise.parquet": ("random bytes", _hostile("h/noise.parquet", _write(bytes(range(256)) * 8))),
    "half.parquet": ("a Parquet file cut in half", _hostile("h/half.parquet", _truncate)),
    "retyped.parquet": ("reward stored as text", _hostile("h/retyped.parquet", _retype)),
    "dropped.parquet": ("the response_tokens column missing", _hostile("h/dropped.parquet", _drop_column)),
    "tampered.parquet": ("rewards edited, checksum left as it was", _hostile("h/tampered.parquet", _tamper)),
    "future.parquet": ("a schema version from the future", _hostile("h/future.parquet", _future)),
    "lists.parquet": ("loss_mask shorter than the response", _hostile("h/lists.parquet", _mismatched_lists)),
    "code.pt": ("a .pt whose unpickling runs code", _hostile("h/code.pt", _pickle_code)),
    "noise.pt": ("random bytes as .pt", _hostile("h/noise.pt", _write(b"\x80\x04garbage" * 10))),
    "empty.pt": ("an empty .pt", _hostile("h/empty.pt", _write(b""))),
    "nosamples.pt": ("a slime dump without samples", _hostile("h/nosamples.pt", _pt_no_samples)),
    "data.csv": ("an unsupported extension", _hostile("h/data.csv", _write(b"a,b\n1,2\n"))),
    "tokens.parquet": (
        "an 8 KB Parquet declaring 20 M tokens",
        _hostile("h/tokens.parquet", _declared_tokens(20_000_000, 1)),
    ),
    "long.parquet": (
        "samples of 100 tokens for a model of 64 positions",
        _hostile("h/long.parquet", _declared_tokens(400, 4)),
    ),
}


def _file(name: str) -> Callable[[Path], str]:
    return lambda tmp: str(HOSTILE_FILES[name][1](tmp))


def inspect(name: str, needle: str) -> Case:
    return Case(
        "hostile file",
        f"`inspect` of {HOSTILE_FILES[name][0]}",
        lambda tmp: ["inspect", _file(name)(tmp)],
        needle,
    )


def _run_dir(tmp: Path, broken: str) -> str:
    """A small run dir made by hand, with one part broken."""
    d = tmp / f"run-{broken}"
    (d / "rollouts").mkdir(parents=True, exist_ok=True)
    shutil.copy(good_rollout(tmp), d / "rollouts" / "rollout_000000.parquet")
    (d / "metrics.jsonl").write_text(
        json.dumps({"kind": "step", "rollout_id": 0, "step": 0, "metrics": {"train/loss": 0.1}}) + "\n"
    )
    (d / "config.yaml").write_text("name: x\n")
    if broken == "yaml":
        (d / "config.yaml").write_text("name: [unclosed\n")
    if broken == "rollout":
        (d / "rollouts" / "rollout_000000.parquet").write_bytes(b"PAR1 garbage")
    if broken == "unknown-key":
        (d / "config.yaml").write_text("train: {learning_rate: 1}\n")
    if broken == "dup-key":
        (d / "config.yaml").write_text("name: x\nname: y\n")
    if broken == "noconfig":
        (d / "config.yaml").unlink()
    return str(d)


def _checkpoint(tmp: Path, broken: str) -> str:
    """A --load dir with one broken part."""
    d = tmp / f"ckpt-{broken}"
    it = d / "iter_0000000"
    it.mkdir(parents=True, exist_ok=True)
    (it / "meta.json").write_text(json.dumps({"rollout_id": 0, "global_step": 1}))
    (it / "config.json").write_text("{}")
    (it / "model.safetensors").write_bytes(b"not safetensors")
    (d / "latest_checkpointed_iteration.txt").write_text("0")
    if broken == "latest":
        (d / "latest_checkpointed_iteration.txt").write_text("zero")
    if broken == "missing-iter":
        (d / "latest_checkpointed_iteration.txt").write_text("7")
    if broken == "meta":
        (it / "meta.json").write_text("{not json")
    return str(d)


def whole_checkpoint(d: Path, rollout_id: int = 0) -> Path:
    """An iter_ dir with every file a torch-format `--load` reads (tiny tensors; config.json implies no shapes)."""
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.ones(2, 3)}, str(d / "model.safetensors"))
    save_file({"w::exp_avg": torch.zeros(2, 3)}, str(d / "optimizer.safetensors"))
    save_file({"torch_rng": torch.get_rng_state()}, str(d / "rng.safetensors"))
    (d / "scheduler.json").write_text(json.dumps({"last_epoch": rollout_id}))
    (d / "config.json").write_text("{}")
    (d / "meta.json").write_text(json.dumps({"rollout_id": rollout_id, "global_step": rollout_id + 1}))
    (d.parent / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
    return d


def _save_dir(tmp: Path, broken: str) -> str:
    """A --save dir with one whole checkpoint, then one thing wrong: a file a load reads removed, or only an
    unfinished save (a trainer killed before its rename) beside it."""
    d = tmp / f"save-{broken}"
    it = whole_checkpoint(d / "iter_0000001", 1)
    if broken.endswith((".safetensors", ".json")):
        (it / broken).unlink()
    if broken == "only-tmp":
        it.rename(d / "iter_0000002.tmp-4242")
        (d / "latest_checkpointed_iteration.txt").unlink()
    return str(d)


def _prompts_declaring(tokens: int) -> Callable[[Path], str]:
    """A Parquet prompt file whose one row carries a list of `tokens` zeros (a few KB on disk)."""

    def build(tmp: Path) -> str:
        import numpy as np

        path = tmp / "prompts-big.parquet"
        values = pa.array(np.zeros(tokens, np.int32))
        column = pa.ListArray.from_arrays(pa.array([0, tokens], pa.int32()), values)
        pq.write_table(pa.table({"input": ["1+1="], "label": ["2"], "ids": column}), path, compression="zstd")
        return str(path)

    return build


def _damaged_run(tmp: Path, what: str) -> str:
    """A hand-made run dir (see `_run_dir`) with its metrics.jsonl or its rollout damaged as `what` says."""
    d = Path(_run_dir(tmp, f"damaged-{what}"))
    rollout = d / "rollouts" / "rollout_000000.parquet"
    if what in ("tampered.parquet", "dropped.parquet", "long.parquet"):
        shutil.copy(HOSTILE_FILES[what][1](tmp), rollout)
    if what == "long.parquet":  # the tiny-arith model: 64 positions
        from recipes.tiny_arith.bootstrap import ensure_checkpoint

        (d / "config.yaml").write_text(f"name: x\nhf_checkpoint: {ensure_checkpoint()}\n")
    records = {
        "no-id": {"kind": "step", "step": 0, "metrics": {"train/loss": 0.1}},
        "text-step": {"kind": "step", "rollout_id": 0, "step": "zero", "metrics": {}},
        "list-metrics": {"kind": "rollout", "rollout_id": 0, "metrics": ["x" * 500]},
    }
    if what in records:
        (d / "metrics.jsonl").write_text(json.dumps(records[what]) + "\n")
    return str(d)


def _replay_of(what: str, task: str = "generate") -> Callable[[Path], list[str]]:
    return lambda tmp: ["replay", _damaged_run(tmp, what), "--rollout-id", "0", "--task", task]
