"""Unit tests for the artifact store: schema round trips, integrity checks, atomicity, layout."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import stat
import struct
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pydantic
import pytest

from artifacts import (
    SAMPLE_SCHEMA,
    SCHEMA_VERSION,
    ArtifactError,
    ArtifactRef,
    RunPaths,
    Sample,
    append_metrics,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    read_metadata,
    read_metrics,
    read_rollout,
    read_table,
    samples_to_table,
    schema,
    sha256_bytes,
    sha256_file,
    store,
    table_content_sha256,
    table_to_samples,
    write_rollout,
    write_table,
)
from tests.helpers import float32_list, make_sample


def _edge_samples() -> list[Sample]:
    """Unicode, empty lists, extreme ints and awkward float32 values (-0.0, -inf, subnormal)."""
    awkward = float32_list([-0.0, -math.inf, -1e-45, -3.4028234663852886e38, -1.0000001, -0.1])
    return [
        make_sample(0),
        make_sample(
            1,
            n=6,
            prompt="Ünïcödé ✓ 中文 😀 e\u0301 \x00 nul",
            response="→ ∞ 🚀\n\ttabs",
            label="",
            rollout_log_probs=awkward,
            loss_mask=[0, 1, 1, 0, 1, 1],
            seed=2**63 - 1,
            weight_version=-1,
            metadata={"ключ": ["ü", {"nested": None}], "f": 0.1, "big": 2**62},
        ),
        make_sample(2, n=0, prompt="", prompt_tokens=[], rollout_log_probs=[], status="aborted", metadata={}),
        make_sample(3, rollout_log_probs=[], status="truncated", seed=-(2**63), reward=-0.5),
    ]


def _float32_bits(values: list[float]) -> bytes:
    return np.asarray(values, dtype=np.float32).tobytes()


def _data_region(data: bytes) -> tuple[int, int]:
    """[start, end) of a Parquet file's column data: between the leading magic and the footer."""
    footer_length = struct.unpack("<i", data[-8:-4])[0]
    return 4, len(data) - 8 - footer_length


# --------------------------------------------------------------------------------------------
# Round trips and determinism
# --------------------------------------------------------------------------------------------


def test_rollout_round_trip_is_exact(tmp_path: Path) -> None:
    samples = _edge_samples()
    ref = write_rollout(tmp_path / "rollout.parquet", samples, metadata={"tokenizer": "abc123"})

    back = read_rollout(ref)

    assert back == samples
    for original, restored in zip(samples, back, strict=True):
        # == on floats would accept -0.0 == 0.0; compare the float32 bit patterns instead.
        assert _float32_bits(restored.rollout_log_probs) == _float32_bits(original.rollout_log_probs)
        assert type(restored.reward) is float
    assert ref.rows == len(samples) and ref.kind == "rollout" and ref.schema_version == SCHEMA_VERSION
    assert ref.path == str((tmp_path / "rollout.parquet").absolute())
    assert ref.sha256 == sha256_file(ref.path)


def test_table_round_trip_keeps_schema_and_values(tmp_path: Path) -> None:
    table = samples_to_table(_edge_samples())
    assert table.schema.equals(SAMPLE_SCHEMA)

    back = read_table(write_table(tmp_path / "t.parquet", table, kind="rollout"))

    # Parquet names list children "element"; the reader restores Arrow's "item".
    assert back.schema.equals(SAMPLE_SCHEMA, check_metadata=False)
    assert back.equals(table)
    assert table_content_sha256(back) == table_content_sha256(table)


def test_empty_rollout_round_trips(tmp_path: Path) -> None:
    ref = write_rollout(tmp_path / "empty.parquet", [])
    assert ref.rows == 0
    assert read_rollout(ref) == []


def test_write_is_deterministic(tmp_path: Path) -> None:
    samples = _edge_samples()
    first = write_rollout(tmp_path / "a.parquet", samples, metadata={"b": 1, "a": {"y": 2, "x": 1}})
    second = write_rollout(tmp_path / "b.parquet", samples, metadata={"a": {"x": 1, "y": 2}, "b": 1})
    # Same content in a different chunking must give the same bytes too.
    table = samples_to_table(samples)
    rechunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 2), table.slice(3)])
    third = write_table(
        tmp_path / "c.parquet", rechunked, kind="rollout", metadata={"b": 1, "a": {"x": 1, "y": 2}}
    )

    assert first.sha256 == second.sha256 == third.sha256
    assert Path(first.path).read_bytes() == Path(third.path).read_bytes()

    changed = write_rollout(
        tmp_path / "d.parquet", [*samples[:-1], dataclasses.replace(samples[-1], reward=0.25)]
    )
    assert changed.sha256 != first.sha256


def test_small_tables_are_stored_uncompressed_and_large_ones_with_zstd(tmp_path: Path) -> None:
    """The codec follows the content's size (64 KiB), so equal content still gives equal bytes at either size."""
    small = write_rollout(tmp_path / "small.parquet", [make_sample(i, n=8) for i in range(16)])
    samples = [make_sample(i, n=256) for i in range(64)]
    large = write_rollout(tmp_path / "large.parquet", samples)

    def codecs(path: str) -> set[str]:
        group = pq.ParquetFile(path).metadata.row_group(0)
        return {group.column(c).compression for c in range(group.num_columns)}

    assert codecs(small.path) == {"UNCOMPRESSED"} and codecs(large.path) == {"ZSTD"}
    assert read_rollout(large) == samples
    table = samples_to_table(samples)
    rechunked = write_table(
        tmp_path / "rechunked.parquet",
        pa.concat_tables([table.slice(0, 5), table.slice(5)]),
        kind="rollout",
        metadata={},
    )
    assert rechunked.sha256 == large.sha256


def test_content_hash_ignores_layout_and_garbage_under_nulls() -> None:
    values = pa.array([1, 2, 3], pa.int64())
    # Same logical column [1, null, 3] with different bytes under the null slot.
    zero_under_null = pa.array([1, None, 3], pa.int64())
    garbage_under_null = pa.Array.from_buffers(
        pa.int64(), 3, [pa.array([True, False, True]).buffers()[1], values.buffers()[1]]
    )
    assert garbage_under_null.to_pylist() == [1, None, 3]

    assert table_content_sha256(pa.table({"v": zero_under_null})) == table_content_sha256(
        pa.table({"v": garbage_under_null})
    )
    assert table_content_sha256(pa.table({"v": values})) != table_content_sha256(
        pa.table({"v": zero_under_null})
    )
    assert table_content_sha256(pa.table({"v": values})) != table_content_sha256(pa.table({"w": values}))


def test_generic_tables_with_nulls_and_nested_types_round_trip(tmp_path: Path) -> None:
    table = pa.table(
        {
            "ints": pa.array([1, None, 3], pa.int64()),
            "lists": pa.array([[1, None], None, []], pa.list_(pa.int8())),
            "map": pa.array([[("a", 1.5)], [], None], pa.map_(pa.string(), pa.float64())),
            "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
            "struct": pa.array([{"k": 1}, None, {"k": None}]),
            "u32": pa.array([1, 2, 2**32 - 1], pa.uint32()),
        }
    )
    ref = write_table(tmp_path / "g.parquet", table, kind="logprobs", metadata={"note": "x"})
    back = read_table(ref)
    assert back.equals(table)
    assert read_metadata(ref) == {
        "schema_version": SCHEMA_VERSION,
        "kind": "logprobs",
        "content_sha256": table_content_sha256(table),
        "note": "x",
    }


def test_metadata_is_json_encoded_and_reserved_keys_rejected(tmp_path: Path) -> None:
    user = {
        "tokenizer_fingerprint": "sha:ab",
        "sampling": {"temperature": 1.0, "top_p": 0.9},
        "n": 8,
        "t": 0.5,
    }
    ref = write_rollout(tmp_path / "r.parquet", [make_sample()], metadata=user)

    raw = pq.ParquetFile(ref.path).schema_arrow.metadata
    assert json.loads(raw[b"rollflow.sampling"]) == user["sampling"]
    assert json.loads(raw[b"rollflow.kind"]) == "rollout"
    meta = read_metadata(ref.path)
    assert meta == {
        **user,
        "schema_version": SCHEMA_VERSION,
        "kind": "rollout",
        "content_sha256": meta["content_sha256"],
    }

    with pytest.raises(ValueError, match="'kind' is reserved"):
        write_rollout(tmp_path / "bad.parquet", [make_sample()], metadata={"kind": "x"})
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        write_rollout(tmp_path / "bad.parquet", [make_sample()], metadata={"obj": object()})
    assert not (tmp_path / "bad.parquet").exists()


def test_types_parquet_cannot_store_are_rejected_at_write(tmp_path: Path) -> None:
    table = pa.table({"day": pa.array([0, 86_400_000], pa.date64())})
    with pytest.raises(ValueError, match="day: date64"):
        write_table(tmp_path / "d.parquet", table, kind="metrics")
    assert not (tmp_path / "d.parquet").exists()


# --------------------------------------------------------------------------------------------
# Schema evolution
# --------------------------------------------------------------------------------------------


def test_newer_schema_version_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "future.parquet"
    with monkeypatch.context() as m:
        m.setattr(store, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        ref = write_rollout(path, [make_sample()])
    assert ref.schema_version == SCHEMA_VERSION + 1

    message = f"schema version {SCHEMA_VERSION + 1}.*reads schema version {SCHEMA_VERSION}"
    for read in (read_table, read_rollout, lambda p: read_table(p, verify=False), read_metadata):
        with pytest.raises(ArtifactError, match=message):
            read(path)


def test_older_schema_version_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(store, "SCHEMA_VERSION", 0)
        ref = write_rollout(tmp_path / "old.parquet", [make_sample()])
    assert read_rollout(ref) == [make_sample()]


def test_plain_parquet_is_not_an_artifact(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(samples_to_table([make_sample()]), path)
    with pytest.raises(ArtifactError, match=r"plain\.parquet: not a rollflow artifact"):
        read_rollout(path)


def test_missing_column_is_named(tmp_path: Path) -> None:
    table = samples_to_table([make_sample()]).drop_columns(["reward", "seed"])
    ref = write_table(tmp_path / "r.parquet", table, kind="rollout")
    with pytest.raises(
        ArtifactError, match=r"r\.parquet: .*missing required column\(s\) \['reward', 'seed'\]"
    ):
        read_rollout(ref)


def test_unknown_extra_columns_are_ignored(tmp_path: Path) -> None:
    samples = _edge_samples()
    table = samples_to_table(samples)
    table = table.append_column("added_in_v2", pa.array([1.0] * len(samples)))
    table = table.select(["added_in_v2", *reversed(table.column_names[:-1])])  # column order is free
    ref = write_table(tmp_path / "r.parquet", table, kind="rollout")
    assert read_rollout(ref) == samples


def test_widened_columns_are_cast_and_nulls_rejected() -> None:
    table = samples_to_table([make_sample()])
    widened = table.set_column(
        table.schema.get_field_index("response_tokens"),
        "response_tokens",
        table.column("response_tokens").cast(pa.list_(pa.int64())),
    )
    assert table_to_samples(widened) == [make_sample()]

    too_wide = table.set_column(
        table.schema.get_field_index("response_length"), "response_length", pa.array([2**40], pa.int64())
    )
    with pytest.raises(ValueError, match="column 'response_length'"):
        table_to_samples(too_wide)

    with_null = table.set_column(
        table.schema.get_field_index("label"), "label", pa.array([None], pa.string())
    )
    with pytest.raises(ValueError, match="column 'label' has 1 null"):
        table_to_samples(with_null)


# --------------------------------------------------------------------------------------------
# Integrity
# --------------------------------------------------------------------------------------------


def test_flipped_bytes_in_the_middle_are_detected(tmp_path: Path) -> None:
    ref = write_rollout(tmp_path / "r.parquet", [make_sample(i, n=64) for i in range(8)])
    data = Path(ref.path).read_bytes()
    start, end = _data_region(data)
    middle = (start + end) // 2
    corrupt = bytearray(data)
    corrupt[middle : middle + 8] = bytes(b ^ 0xFF for b in corrupt[middle : middle + 8])
    Path(ref.path).write_bytes(corrupt)

    with pytest.raises(ArtifactError, match=r"r\.parquet"):
        read_rollout(ref.path)
    with pytest.raises(ArtifactError, match=f"expects {ref.sha256}, the file has {sha256_bytes(corrupt)}"):
        read_rollout(ref)
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        ref.verify()


def test_no_single_byte_flip_returns_wrong_samples(tmp_path: Path) -> None:
    """Sweep single-byte flips over the whole file: the reader either fails loudly or (for bytes
    that do not encode data, e.g. unused header fields) returns exactly the original samples;
    with the ref, every flip is caught."""
    samples = [make_sample(i, n=8) for i in range(3)]
    path = tmp_path / "r.parquet"
    ref = write_rollout(path, samples)
    data = path.read_bytes()
    for position in range(0, len(data), 23):
        corrupt = bytearray(data)
        corrupt[position] ^= 0x5A
        path.write_bytes(corrupt)
        with contextlib.suppress(ArtifactError):  # detected: fine; not detected: the data must be unchanged
            assert read_rollout(path) == samples, f"flip at byte {position} changed the data silently"
        with pytest.raises(ArtifactError):
            read_rollout(ref)


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    ref = write_rollout(tmp_path / "r.parquet", [make_sample(i) for i in range(4)])
    data = Path(ref.path).read_bytes()
    for length in (0, 3, len(data) // 2, len(data) - 1):
        Path(ref.path).write_bytes(data[:length])
        with pytest.raises(ArtifactError, match=r"r\.parquet: not a readable Parquet file"):
            read_table(ref.path)


def test_data_not_matching_its_checksum_is_detected(tmp_path: Path) -> None:
    """A well-formed file whose data was changed (e.g. edited with another tool, keeping the
    metadata) passes every Parquet-level check; only the content checksum catches it."""
    path = tmp_path / "r.parquet"
    write_rollout(path, [make_sample(0)])
    original = pq.read_table(path)
    edited = samples_to_table([make_sample(0, reward=42.0)]).replace_schema_metadata(original.schema.metadata)
    pq.write_table(edited, path)

    with pytest.raises(ArtifactError, match=r"r\.parquet: content checksum mismatch"):
        read_rollout(path)
    assert read_rollout(path, verify=False)[0].reward == 42.0


def test_ref_verify(tmp_path: Path) -> None:
    ref = write_table(tmp_path / "m.parquet", pa.table({"x": [1, 2]}), kind="metrics")
    ref.verify()
    Path(ref.path).unlink()
    with pytest.raises(ArtifactError, match=r"m\.parquet: artifact file is missing"):
        ref.verify()
    with pytest.raises(FileNotFoundError):
        read_table(ref)


# --------------------------------------------------------------------------------------------
# Refs
# --------------------------------------------------------------------------------------------


def test_artifact_ref_json_round_trip(tmp_path: Path) -> None:
    ref = write_rollout(tmp_path / "r.parquet", [make_sample()])
    again = ArtifactRef.model_validate_json(ref.model_dump_json())
    assert again == ref
    assert hash(again) == hash(ref)  # frozen: usable as a dict key / in cache keys
    with pytest.raises(pydantic.ValidationError):
        ref.rows = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [("path", "relative/r.parquet"), ("sha256", "abc"), ("rows", -1), ("kind", "")],
)
def test_artifact_ref_rejects_bad_fields(field: str, value: object) -> None:
    good = {
        "path": "/runs/x/r.parquet",
        "sha256": "0" * 64,
        "rows": 1,
        "schema_version": 1,
        "kind": "rollout",
    }
    with pytest.raises(pydantic.ValidationError, match=field):
        ArtifactRef(**{**good, field: value})


# --------------------------------------------------------------------------------------------
# Sample validation
# --------------------------------------------------------------------------------------------


BAD_SAMPLES: list[tuple[dict[str, object], str]] = [
    ({"status": "done"}, "status"),
    ({"response_length": 5}, "response_tokens"),
    ({"loss_mask": [1, 1, 1]}, "loss_mask"),
    ({"loss_mask": [1, 2, 1, 0]}, "loss_mask"),
    ({"rollout_log_probs": [-0.5]}, "rollout_log_probs"),
    ({"prompt_tokens": [1, -2]}, "prompt_tokens"),
    ({"response_tokens": [1, 2, 3, 2**31]}, "response_tokens"),
    ({"metadata": {"pair": (1, 2)}}, "metadata"),
    ({"metadata": {1: "int key"}}, "metadata"),
    ({"metadata": {"x": object()}}, "metadata"),
    ({"metadata": {"x": math.nan}}, "metadata"),
    ({"reward": "1.0"}, "reward"),
    ({"seed": 1.5}, "seed"),
    ({"sample_index": -1}, "sample_index"),
    ({"label": None}, "label"),
    ({"reward": True}, "reward"),
    ({"group_index": False}, "group_index"),
    ({"metadata": {"x": [math.inf]}}, "metadata"),
    ({"metadata": "not a dict"}, "metadata"),
]


@pytest.mark.parametrize(("changes", "field"), BAD_SAMPLES)
def test_sample_validate_names_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"Sample\.{field}"):
        make_sample(**changes).validate()


def test_sample_validate_accepts_unknown_log_probs_and_empty_responses() -> None:
    make_sample(rollout_log_probs=[]).validate()
    make_sample(n=0).validate()
    make_sample(reward=1).validate()  # an int reward is a valid float


def test_write_rollout_validates_first(tmp_path: Path) -> None:
    samples = [make_sample(0), make_sample(1, status="done")]
    with pytest.raises(
        ValueError, match=r"sample 1 \(rollout_id=7, group_index=0, sample_index=1\): Sample\.status"
    ):
        write_rollout(tmp_path / "r.parquet", samples)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def column_wise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes check even a few samples column-wise (as they do from `COLUMN_WISE_FROM` samples up)."""
    monkeypatch.setattr(schema, "COLUMN_WISE_FROM", 1)


@pytest.mark.parametrize("changes", [c for c, _ in BAD_SAMPLES])
@pytest.mark.usefixtures("column_wise")
def test_write_rollout_rejects_what_validate_rejects(tmp_path: Path, changes: dict[str, object]) -> None:
    """The column-wise checks of a write fail exactly where `Sample.validate` fails, with its message."""
    samples = [make_sample(0), make_sample(1), make_sample(2, **changes)]
    with pytest.raises(ValueError) as write_error:
        write_rollout(tmp_path / "r.parquet", samples)
    with pytest.raises(ValueError) as validate_error:
        samples[2].validate()
    bad = samples[2]
    assert str(write_error.value) == (
        f"sample 2 (rollout_id=7, group_index={bad.group_index!r}, sample_index={bad.sample_index!r}): "
        f"{validate_error.value}"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("column_wise")
def test_write_rollout_checks_valid_samples_column_wise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid plain samples are written without validating them one by one; a sample whose values are valid but
    not of the plain types (an int subclass, a tuple-free nested dict) is validated one by one and written."""
    samples = [
        make_sample(i, metadata={"finish_reason": "stop", "nested": {"a": [1, 2.5, None]}}) for i in range(4)
    ]
    calls = []
    original = Sample.validate
    monkeypatch.setattr(Sample, "validate", lambda self: (calls.append(self), original(self))[1])
    ref = write_rollout(tmp_path / "plain.parquet", samples)
    assert calls == [] and read_rollout(ref) == samples

    class Seed(int):
        """An int subclass: `validate` accepts it, the column-wise type checks leave it to `validate`."""

    odd = [*samples, make_sample(4, seed=Seed(3))]
    ref = write_rollout(tmp_path / "odd.parquet", odd)
    assert len(calls) == len(odd) and read_rollout(ref)[-1].seed == 3


def test_samples_to_table_names_unconvertible_column() -> None:
    with pytest.raises(ValueError, match="column 'seed'"):
        samples_to_table([make_sample(seed=2**64)])


# --------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------


def test_atomic_path_keeps_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    target = tmp_path / "weights.bin"
    target.write_bytes(b"old")

    with pytest.raises(RuntimeError, match="writer crashed"), atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"half-written new")
        raise RuntimeError("writer crashed")

    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]  # temp removed


def test_atomic_path_replaces_on_success_with_normal_permissions(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "table.parquet"
    with atomic_path(target) as tmp:
        pq.write_table(pa.table({"x": [1]}), tmp)
        assert not target.exists()
    assert pq.read_table(target).column("x").to_pylist() == [1]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in target.parent.iterdir()) == ["table.parquet"]


def test_atomic_write_bytes_leaves_old_file_on_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.txt"
    target.write_bytes(b"old")

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()

    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"


def test_atomic_write_json_is_canonical(tmp_path: Path) -> None:
    path = tmp_path / "hash.json"
    atomic_write_json(path, {"b": 1, "a": [1, 2]})
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'
    assert sha256_file(path) == sha256_bytes(path.read_bytes())


# --------------------------------------------------------------------------------------------
# Run layout and metrics
# --------------------------------------------------------------------------------------------


def test_run_paths_formats() -> None:
    paths = RunPaths("runs/demo")
    assert paths.config == Path("runs/demo/config.yaml")
    assert paths.metrics == Path("runs/demo/metrics.jsonl")
    assert paths.rollout(12) == Path("runs/demo/rollouts/rollout_000012.parquet")
    assert paths.eval_rollout(3) == Path("runs/demo/rollouts/eval_000003.parquet")
    assert paths.logprobs(0) == Path("runs/demo/logprobs/rollout_000000.parquet")
    assert paths.checkpoint(5) == Path("runs/demo/checkpoints/iter_0000005")
    assert paths.model_hash(5) == Path("runs/demo/checkpoints/iter_0000005/model_hash_tp0_pp0_dp0_cp0.json")
    assert paths.model_hash(5, tp=1, pp=2, dp=3, cp=4).name == "model_hash_tp1_pp2_dp3_cp4.json"
    assert RunPaths(Path("/abs")).rollout(1_000_000).name == "rollout_1000000.parquet"
    with pytest.raises(ValueError, match="rollout_id"):
        paths.rollout(-1)
    with pytest.raises(ValueError, match="dp"):
        paths.model_hash(1, dp=-1)


def test_metrics_append_and_read(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.jsonl"
    records = [
        {"kind": "rollout", "rollout_id": 0, "metrics": {"rollout/raw_reward": 0.25}},
        {
            "kind": "step",
            "rollout_id": 0,
            "step": 0,
            "metrics": {"train/loss": np.float32(0.5), "train/grad_norm": math.inf},
        },
    ]
    for record in records:
        append_metrics(path, record)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean file must not warn
        back = read_metrics(path)
    assert back[0] == records[0]
    assert back[1]["metrics"] == {"train/loss": 0.5, "train/grad_norm": math.inf}
    assert path.read_text().count("\n") == 2


def test_metrics_truncated_last_line_is_skipped_and_repaired(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_metrics(path, {"kind": "rollout", "rollout_id": 0, "metrics": {}})
    append_metrics(path, {"kind": "rollout", "rollout_id": 1, "metrics": {"note": "ü"}})
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # crash mid-line: the last record is torn

    with pytest.warns(RuntimeWarning, match=r"skipped 1 unreadable line\(s\).*\[2\]"):
        assert [r["rollout_id"] for r in read_metrics(path)] == [0]

    # The next append must not glue its record onto the torn line.
    append_metrics(path, {"kind": "rollout", "rollout_id": 2, "metrics": {}})
    with pytest.warns(RuntimeWarning, match="skipped 1"):
        assert [r["rollout_id"] for r in read_metrics(path)] == [0, 2]


def test_metrics_rejects_non_serialisable(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        append_metrics(tmp_path / "m.jsonl", {"x": object()})


def test_after_preload_arrow_a_rollout_write_and_read_import_nothing_heavy(tmp_path: Path) -> None:
    # the actors and the driver call procs.preload_arrow at set-up, so that the first rollout does not import
    # pandas and pyarrow.compute (0.4-0.8 s) on the loop's path
    import subprocess
    import sys

    code = f"""
import os
import sys
from artifacts import read_rollout, write_rollout
from procs import preload_arrow
from tests.helpers import make_sample
preload_arrow()
before = set(sys.modules)
read_rollout(write_rollout({str(tmp_path / "r.parquet")!r}, [make_sample(0), make_sample(1)]))
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("pandas", "pyarrow", "numpy")), flush=True)
os._exit(0)  # what is imported is the question: skip the interpreter's teardown, where Arrow's threads can abort
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
