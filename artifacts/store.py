"""The artifact store: Parquet tables with verified metadata, refs, run-directory paths, metrics.

Every table artifact is one Parquet file written atomically, whose file-level key-value metadata
holds (all values JSON-encoded):

- ``rollflow.schema_version``: ``SCHEMA_VERSION`` of the writer; readers refuse newer versions.
- ``rollflow.kind``: what the table is ("rollout", "eval", "logprobs", ...).
- ``rollflow.content_sha256``: sha256 of a canonical serialisation of the table's content (see
  ``table_content_sha256``); readers recompute it, which catches truncated or corrupt files and
  data edited without updating the metadata.
- ``rollflow.<key>``: the caller's metadata (tokenizer fingerprint, sampling params, config hash).

Tasks pass ``ArtifactRef`` (path + sha256 of the file bytes) through Prefect, never tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, field_validator

from artifacts.atomic import atomic_write_bytes, sha256_bytes, sha256_file
from artifacts.schema import SCHEMA_VERSION, Sample, table_to_samples, validated_table

__all__ = [
    "ArtifactError",
    "DEFAULT_LIMITS",
    "ArtifactRef",
    "ReadLimits",
    "RunPaths",
    "append_metrics",
    "check_declared_sizes",
    "check_list_lengths",
    "read_metadata",
    "read_metrics",
    "read_rollout",
    "read_table",
    "record_problem",
    "table_content_sha256",
    "write_rollout",
    "write_table",
]

PathArg = str | os.PathLike[str]

_PREFIX = "rollflow."
_RESERVED_KEYS = ("schema_version", "kind", "content_sha256")

# Fixed writer settings: the file bytes must be a function of the table content (and the pyarrow version,
# which stamps itself into the footer). So equal rollouts have equal sha256, and Prefect cache keys built from
# them hit.
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "version": "2.6",
    "data_page_version": "1.0",
    # No min/max statistics: neither the page CRC nor the content checksum covers them, so a flipped byte
    # there would go unnoticed. Rollout files are too small for query engines to gain from skipping pages.
    "write_statistics": False,
    "write_page_checksum": True,  # page CRCs: a flipped byte fails at decode, naming the page
    "store_schema": True,  # ARROW:schema restores Arrow types (uint32, large_string, ...) on read
}
# Tables whose content (its canonical serialisation, `table_content_sha256`) is smaller are written uncompressed:
# zstd saves little on them and costs time on every RL step. Decided by the content's size, so that equal tables
# still give equal bytes.
_COMPRESS_FROM_BYTES = 64 << 10
_UNCOMPRESSED_OPTIONS = {
    **{k: v for k, v in _PARQUET_OPTIONS.items() if k != "compression_level"},
    "compression": "none",
}


class ArtifactError(RuntimeError):
    """An artifact is missing, corrupt, of an unreadable schema version, or does not match its ref."""


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What a Parquet file may hold before rollflow reads it: rows, values in one list cell (the tokens of one
    sample) and bytes (file size and the declared uncompressed size of its column data). The defaults are far
    above anything a run writes; a run narrows them to its model's positions and its rollout size."""

    rows: int = 1 << 20
    list_len: int = 1 << 20
    bytes: int = 2 << 30


DEFAULT_LIMITS = ReadLimits()


def check_declared_sizes(path: PathArg, parquet: pq.ParquetFile, limits: ReadLimits) -> None:
    """Raise ``ArtifactError`` naming ``path`` when its footer declares more than ``limits`` allow: rows,
    uncompressed bytes, or values of a list column above ``list_len`` per row in a row group (the average;
    ``check_list_lengths`` checks each row once decoded). Decodes nothing into memory beyond a fixed buffer."""
    metadata = parquet.metadata
    if metadata.num_rows > limits.rows:
        raise ArtifactError(
            f"{path}: declares {metadata.num_rows} rows, more than the {limits.rows} allowed here"
        )
    try:
        # scans every column chunk through a fixed-size buffer: a footer that does not describe its chunks raises
        # here, where pyarrow aborts the process when a damaged chunk's metadata is read directly (26.0)
        parquet.scan_contents()
    except (pa.ArrowException, OSError) as e:
        raise ArtifactError(f"{path}: cannot decode the Parquet data (corrupt file?): {e}") from e
    schema = metadata.schema
    # values inside a list (prompt_tokens.list.element, ...), by path
    in_lists = {
        schema.column(i).path
        for i in range(metadata.num_columns)
        if schema.column(i).max_repetition_level > 0
    }
    declared = 0
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            declared += max(chunk.total_uncompressed_size, 0)
            if chunk.path_in_schema not in in_lists:
                continue
            if chunk.num_values > max(group.num_rows, 1) * limits.list_len:
                raise ArtifactError(
                    f"{path}: declares {chunk.num_values} values of {chunk.path_in_schema} in {group.num_rows} "
                    f"row(s) (row group {g}), more than {limits.list_len} per row"
                )
    if declared > limits.bytes:
        raise ArtifactError(
            f"{path}: declares {declared} bytes of uncompressed data, more than the {limits.bytes} allowed here"
        )


def check_list_lengths(path: PathArg, table: pa.Table, limits: ReadLimits) -> None:
    """Raise ``ArtifactError`` naming ``path``, the row and the column when a list cell of ``table`` holds more
    than ``limits.list_len`` values (checked in Arrow, before any row becomes Python objects)."""
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns, strict=True):
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            continue
        lengths = pc.list_value_length(column)
        longest = pc.max(lengths).as_py()
        if longest is not None and longest > limits.list_len:
            row = pc.index(lengths, longest).as_py()
            raise ArtifactError(
                f"{path}: row {row}: {name} holds {longest} values, more than the {limits.list_len} allowed here"
            )


class ArtifactRef(BaseModel, frozen=True):
    """A small, JSON-serialisable handle on one artifact file, passed between Prefect tasks."""

    path: str = Field(description="Absolute path of the artifact file.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex sha256 of the file's bytes.")
    rows: int = Field(ge=0, description="Number of rows (samples) in the table; 0 for non-tables.")
    schema_version: int = Field(ge=0, description="SCHEMA_VERSION of the code that wrote the file.")
    kind: str = Field(
        min_length=1, description='What the file holds: "rollout", "eval", "logprobs", "weights", ...'
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # Relative paths would silently point elsewhere in a task run from another cwd.
        if not os.path.isabs(value):
            raise ValueError(f"ArtifactRef.path must be absolute, got {value!r}")
        return value

    def verify(self) -> None:
        """Raise ``ArtifactError`` unless the file exists and its bytes hash to ``sha256``."""
        if not os.path.isfile(self.path):
            raise ArtifactError(f"{self.path}: artifact file is missing (expected sha256 {self.sha256})")
        actual = sha256_file(self.path)
        if actual != self.sha256:
            raise ArtifactError(
                f"{self.path}: sha256 mismatch: the ref expects {self.sha256}, the file has {actual} "
                "(file replaced or corrupted since it was written)"
            )


# --------------------------------------------------------------------------------------------
# Canonical content hash
# --------------------------------------------------------------------------------------------


def _canonical_field(field: pa.Field, name: str, decode_dictionaries: bool) -> pa.Field:
    return pa.field(name, _canonical_type(field.type, decode_dictionaries), nullable=field.nullable)


def _canonical_type(t: pa.DataType, decode_dictionaries: bool) -> pa.DataType:
    """``t`` with the naming that Parquet does not preserve normalised to Arrow's defaults.

    Parquet renames list children ("item" -> "element") and map entries, and re-encodes
    dictionaries, so the same content reads back under a slightly different type. Field-level
    metadata is dropped too.
    """
    if pa.types.is_dictionary(t) and decode_dictionaries:
        return _canonical_type(t.value_type, decode_dictionaries)
    if pa.types.is_list(t):
        return pa.list_(_canonical_field(t.value_field, "item", decode_dictionaries))
    if pa.types.is_large_list(t):
        return pa.large_list(_canonical_field(t.value_field, "item", decode_dictionaries))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_canonical_field(t.value_field, "item", decode_dictionaries), t.list_size)
    if pa.types.is_map(t):
        return pa.map_(
            _canonical_field(t.key_field, "key", decode_dictionaries),
            _canonical_field(t.item_field, "value", decode_dictionaries),
            keys_sorted=t.keys_sorted,
        )
    if pa.types.is_struct(t):
        return pa.struct([_canonical_field(f, f.name, decode_dictionaries) for f in t])
    return t


def _canonical_schema(schema: pa.Schema, decode_dictionaries: bool) -> pa.Schema:
    return pa.schema([_canonical_field(f, f.name, decode_dictionaries) for f in schema])


def _may_hold_nulls(array: pa.Array) -> bool:
    """True if ``array`` or any child has nulls (over-approximates for sliced nested arrays)."""
    if array.null_count:
        return True
    t = array.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _may_hold_nulls(array.values)
    if pa.types.is_map(t):
        return _may_hold_nulls(array.keys) or _may_hold_nulls(array.items)
    if pa.types.is_struct(t):
        return any(_may_hold_nulls(array.field(i)) for i in range(t.num_fields))
    # Other nested types (unions, list views, ...): assume the worst and take the safe path.
    return pa.types.is_nested(t)


class _HashSink:
    """A write-only file object that feeds everything written into a sha256 (no buffering) and counts it."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self.closed = False
        self.size = 0

    def write(self, data: bytes) -> int:
        self._digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered: every write already went into the digest."""

    def close(self) -> None:
        self.closed = True

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def table_content_sha256(table: pa.Table) -> str:
    """Hex sha256 of the table's content, independent of how it is laid out in memory.

    The canonical serialisation is the Arrow IPC stream of one record batch holding the table
    with schema and field metadata stripped, list/map child names normalised and dictionaries
    decoded. It is equal for a table and the table read back from Parquet, and independent of
    chunking. Values under null slots are undefined in Arrow (the Parquet reader leaves leftovers
    there), so columns holding nulls are rebuilt from Python values, which zeroes those slots.
    """
    return _content_digest(table)[0]


def _content_digest(table: pa.Table) -> tuple[str, int]:
    """`table_content_sha256` and the size in bytes of the serialisation it hashes."""
    schema = _canonical_schema(table.schema, decode_dictionaries=True)
    table = table.replace_schema_metadata(None).cast(schema)
    arrays = []
    for column in table.columns:
        array = column.combine_chunks()
        if _may_hold_nulls(array):
            array = pa.array(array.to_pylist(), type=array.type)
        arrays.append(array)
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    sink = _HashSink()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    return sink.hexdigest(), sink.size


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _encode(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _decode_metadata(raw: dict[bytes, bytes] | None) -> dict[str, Any]:
    """The ``rollflow.*`` entries of Parquet key-value metadata, prefix stripped, JSON-decoded."""
    decoded: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        name = key.decode("utf-8", errors="replace")
        if not name.startswith(_PREFIX):
            continue  # ARROW:schema, pandas metadata, ...: not ours
        text = value.decode("utf-8", errors="replace")
        try:
            decoded[name[len(_PREFIX) :]] = json.loads(text)
        except ValueError:
            decoded[name[len(_PREFIX) :]] = text  # written by another tool: keep it verbatim
    return decoded


def _check_version(path: Path, meta: dict[str, Any]) -> None:
    version = meta.get("schema_version")
    if version is None:
        raise ArtifactError(
            f"{path}: not a rollflow artifact (no {_PREFIX}schema_version in the Parquet metadata)"
        )
    if not isinstance(version, int) or isinstance(version, bool):
        raise ArtifactError(f"{path}: {_PREFIX}schema_version is {version!r}, not an int")
    if version > SCHEMA_VERSION:
        raise ArtifactError(
            f"{path}: written with schema version {version}, but this code reads schema version "
            f"{SCHEMA_VERSION} and older; upgrade rollflow to read it"
        )


def _resolve(path_or_ref: PathArg | ArtifactRef) -> tuple[Path, ArtifactRef | None]:
    if isinstance(path_or_ref, ArtifactRef):
        return Path(path_or_ref.path), path_or_ref
    return Path(os.fspath(path_or_ref)), None


# Schemas (without metadata) whose column types came back unchanged from a Parquet footer: rollflow writes a
# handful, every rollout, so each is checked once per process.
_ROUND_TRIPS: set[pa.Schema] = set()


def _check_round_trip(schema: pa.Schema, data: pa.Buffer) -> None:
    """Raise ``ValueError`` when the Parquet bytes ``data`` written from ``schema`` read back under other column
    types: caught now, instead of as a checksum mismatch at read time."""
    key = schema.remove_metadata()
    if key in _ROUND_TRIPS:
        return
    written = _canonical_schema(pq.read_schema(pa.BufferReader(data)), decode_dictionaries=True)
    expected = _canonical_schema(schema, decode_dictionaries=True)
    if not written.equals(expected):
        changed = [
            f"{f.name}: {f.type} reads back as {written.field(f.name).type}"
            for f in expected
            if not written.field(f.name).equals(f)
        ]
        raise ValueError(
            f"write_table: column types do not round-trip through Parquet ({'; '.join(changed)}); cast them first"
        )
    _ROUND_TRIPS.add(key)


def write_table(
    path: PathArg,
    table: pa.Table,
    *,
    kind: str,
    metadata: dict[str, str | int | float | dict[str, Any]] | None = None,
) -> ArtifactRef:
    """Write ``table`` as a Parquet artifact atomically and return its ref.

    Identical tables (same content, any chunking) and metadata give byte-identical files.
    ``metadata`` values must be JSON-serialisable; they are stored under ``rollflow.<key>``
    (keys ``schema_version``, ``kind``, ``content_sha256`` are reserved). Existing non-rollflow
    schema metadata of ``table`` (e.g. pandas') is kept. Raises ``ValueError`` for a reserved
    key, or for a column whose type Parquet cannot store exactly (e.g. date64): cast it first.
    """
    if not kind:
        raise ValueError("write_table: kind must be a non-empty string")
    # One chunk per column: the Parquet writer's page boundaries can depend on chunk boundaries.
    table = table.combine_chunks()

    kv = {k: v for k, v in (table.schema.metadata or {}).items() if not k.startswith(_PREFIX.encode())}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"write_table: metadata keys must be non-empty strings, got {key!r}")
        if key in _RESERVED_KEYS:
            raise ValueError(f"write_table: metadata key {key!r} is reserved for rollflow")
        try:
            kv[(_PREFIX + key).encode()] = _encode(value).encode()
        except TypeError as e:
            raise ValueError(f"write_table: metadata[{key!r}] is not JSON-serialisable: {e}") from e
    kv[(_PREFIX + "schema_version").encode()] = _encode(SCHEMA_VERSION).encode()
    kv[(_PREFIX + "kind").encode()] = _encode(kind).encode()
    content_sha256, content_bytes = _content_digest(table)
    kv[(_PREFIX + "content_sha256").encode()] = _encode(content_sha256).encode()
    # Sorted so the footer does not depend on the caller's dict order.
    table = table.replace_schema_metadata(dict(sorted(kv.items())))

    sink = pa.BufferOutputStream()
    pq.write_table(
        table, sink, **(_PARQUET_OPTIONS if content_bytes >= _COMPRESS_FROM_BYTES else _UNCOMPRESSED_OPTIONS)
    )
    data = sink.getvalue()

    _check_round_trip(table.schema, data)

    atomic_write_bytes(path, memoryview(data))
    return ArtifactRef(
        path=os.path.abspath(path),
        sha256=sha256_bytes(memoryview(data)),
        rows=table.num_rows,
        schema_version=SCHEMA_VERSION,
        kind=kind,
    )


def read_table(
    path_or_ref: PathArg | ArtifactRef, *, verify: bool = True, limits: ReadLimits = DEFAULT_LIMITS
) -> pa.Table:
    """Read a Parquet artifact written by ``write_table``.

    Always checks the schema version (newer than ``SCHEMA_VERSION`` -> ``ArtifactError``). With
    ``verify`` (default): given a path, checks page CRCs and recomputes the content checksum; given a
    ref, checks the file's sha256 against it, which covers both (the bytes are then exactly those the
    ref was made from: ``write_table``'s, which checked them, or a verified read's). Any mismatch
    raises ``ArtifactError`` naming the file. A missing file raises ``FileNotFoundError``. The
    returned table has the file's schema metadata and Arrow's default list/map child names ("item",
    "entries", "key", "value"). A file larger than ``limits``, or whose footer declares more (see
    ``check_declared_sizes``), raises ``ArtifactError`` naming the file before its data is decoded.
    """
    path, ref = _resolve(path_or_ref)
    size = path.stat().st_size
    if size > limits.bytes:
        raise ArtifactError(f"{path}: {size} bytes, more than the {limits.bytes} allowed here")
    data = path.read_bytes()
    # a ref's sha256 stands for the bytes it was made from, whose CRCs and content checksum were checked then
    check_content = verify and ref is None
    if ref is not None and verify:
        actual = sha256_bytes(data)
        if actual != ref.sha256:
            raise ArtifactError(
                f"{path}: sha256 mismatch: the ref expects {ref.sha256}, the file has {actual} "
                "(file replaced or corrupted since it was written)"
            )
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=check_content)
        raw_metadata = parquet.schema_arrow.metadata
    except (pa.ArrowException, OSError) as e:
        raise ArtifactError(f"{path}: not a readable Parquet file (truncated or corrupt?): {e}") from e
    meta = _decode_metadata(raw_metadata)
    _check_version(path, meta)  # before decoding data: a newer file may not even decode
    if ref is None or not verify:  # a ref's verified bytes are write_table's: within what it wrote
        check_declared_sizes(path, parquet, limits)  # before decoding: a tiny file can declare gigabytes
    try:
        table = parquet.read()
    except (pa.ArrowException, OSError) as e:
        raise ArtifactError(f"{path}: cannot decode the Parquet data (corrupt file?): {e}") from e
    check_list_lengths(path, table, limits)

    if check_content:
        expected = meta.get("content_sha256")
        if not isinstance(expected, str):
            raise ArtifactError(
                f"{path}: no {_PREFIX}content_sha256 in the Parquet metadata; cannot verify it"
            )
        actual = table_content_sha256(table)
        if actual != expected:
            raise ArtifactError(
                f"{path}: content checksum mismatch: the metadata records {expected}, the data hashes "
                f"to {actual} (corrupt or modified file)"
            )
    schema = _canonical_schema(table.schema, decode_dictionaries=False).with_metadata(table.schema.metadata)
    return table.cast(schema)


def read_metadata(path_or_ref: PathArg | ArtifactRef) -> dict[str, Any]:
    """The artifact's metadata: the caller's keys decoded, plus ``schema_version``, ``kind`` and
    ``content_sha256``. Reads only the Parquet footer; does not verify the data."""
    path, _ = _resolve(path_or_ref)
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        raw = pq.ParquetFile(path).schema_arrow.metadata
    except (pa.ArrowException, OSError) as e:
        raise ArtifactError(f"{path}: not a readable Parquet file (truncated or corrupt?): {e}") from e
    meta = _decode_metadata(raw)
    _check_version(path, meta)
    return meta


# --------------------------------------------------------------------------------------------
# Rollouts
# --------------------------------------------------------------------------------------------


def write_rollout(
    path: PathArg,
    samples: Iterable[Sample],
    *,
    metadata: dict[str, Any] | None = None,
    kind: str = "rollout",
) -> ArtifactRef:
    """Validate every sample, then write them as a rollout artifact (``kind="eval"`` for eval sets).

    Raises ``ValueError`` naming the first invalid sample (position and ids) and field.
    """
    return write_table(path, validated_table(list(samples)), kind=kind, metadata=metadata)


def read_rollout(
    path_or_ref: PathArg | ArtifactRef, *, verify: bool = True, limits: ReadLimits = DEFAULT_LIMITS
) -> list[Sample]:
    """Read samples from a rollout (or eval) artifact; see ``read_table`` for the checks and ``limits``.

    Extra columns written by newer code are ignored; a missing required column raises
    ``ArtifactError`` naming the file and the column.
    """
    path, _ = _resolve(path_or_ref)
    table = read_table(path_or_ref, verify=verify, limits=limits)
    try:
        return table_to_samples(table)
    except ValueError as e:
        raise ArtifactError(f"{path}: {e}") from e


# --------------------------------------------------------------------------------------------
# Run directory layout (DESIGN §3)
# --------------------------------------------------------------------------------------------


def _check_id(value: int, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, init=False)
class RunPaths:
    """Paths inside a run directory, formatted as DESIGN §3 fixes them. Pure: creates nothing.

    ``run_dir`` is kept as given (not resolved), so relative run dirs give relative paths.
    """

    run_dir: Path

    def __init__(self, run_dir: PathArg) -> None:
        object.__setattr__(self, "run_dir", Path(run_dir))

    @property
    def config(self) -> Path:
        """``config.yaml``: the resolved config of the run."""
        return self.run_dir / "config.yaml"

    @property
    def metrics(self) -> Path:
        """``metrics.jsonl``: one JSON record per line (see ``append_metrics``)."""
        return self.run_dir / "metrics.jsonl"

    @property
    def start_weights(self) -> Path:
        """``start_weights.json``: the weights_sha256 of the starting and the reference model, as the trainer
        held them before its first step."""
        return self.run_dir / "start_weights.json"

    def rollout(self, rollout_id: int) -> Path:
        """``rollouts/rollout_{id:06d}.parquet``."""
        return self.run_dir / "rollouts" / f"rollout_{_check_id(rollout_id, 'rollout_id'):06d}.parquet"

    def eval_rollout(self, rollout_id: int) -> Path:
        """``rollouts/eval_{id:06d}.parquet``."""
        return self.run_dir / "rollouts" / f"eval_{_check_id(rollout_id, 'rollout_id'):06d}.parquet"

    def logprobs(self, rollout_id: int) -> Path:
        """``logprobs/rollout_{id:06d}.parquet``."""
        return self.run_dir / "logprobs" / f"rollout_{_check_id(rollout_id, 'rollout_id'):06d}.parquet"

    def checkpoint(self, iteration: int) -> Path:
        """``checkpoints/iter_{id:07d}`` (a directory)."""
        return self.run_dir / "checkpoints" / f"iter_{_check_id(iteration, 'iteration'):07d}"

    def model_hash(self, iteration: int, tp: int = 0, pp: int = 0, dp: int = 0, cp: int = 0) -> Path:
        """``checkpoints/iter_{id:07d}/model_hash_tp{t}_pp{p}_dp{d}_cp{c}.json``."""
        ranks = {
            name: _check_id(value, name) for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp))
        }
        return self.checkpoint(iteration) / "model_hash_tp{tp}_pp{pp}_dp{dp}_cp{cp}.json".format(**ranks)


# --------------------------------------------------------------------------------------------
# metrics.jsonl
# --------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    # numpy scalars/arrays and torch tensors: metrics often come straight from them.
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"metrics value of type {type(value).__name__} is not JSON-serialisable")


def append_metrics(path: PathArg, record: dict[str, Any], *, sync: bool = True) -> None:
    """Append ``record`` as one JSON line, then fsync if ``sync``. An fsync also makes every line appended
    before it durable, so a writer may sync only the records that mark a point to resume from.

    The line goes out in one ``write`` on an ``O_APPEND`` descriptor, so concurrent appenders do
    not interleave and a crash leaves at most one torn line at the end. If a previous crash left
    such a torn line, a newline is written first so the new record stays readable on its own
    line. NaN/inf are written as Python's json does (``NaN``), which ``read_metrics`` reads back.
    """
    if not isinstance(record, dict):
        raise TypeError(f"append_metrics: record must be a dict, got {type(record).__name__}")
    data = (json.dumps(record, default=_json_default) + "\n").encode("utf-8")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:  # os.write on a regular file writes everything unless the disk is full
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def record_problem(record: dict[str, Any]) -> str | None:
    """What makes ``record`` not a metrics record of DESIGN §3 (kind, rollout_id, optional step, metrics),
    in words, or None."""
    if not isinstance(record.get("kind"), str):
        return f"'kind' is {_quote(record.get('kind'))}, not a string"
    if not _is_int(record.get("rollout_id")) or record["rollout_id"] < 0:
        return f"'rollout_id' is {_quote(record.get('rollout_id'))}, not a non-negative int"
    if record.get("step") is not None and not _is_int(record["step"]):
        return f"'step' is {_quote(record['step'])}, not an int"
    if not isinstance(record.get("metrics"), dict):
        return f"'metrics' is {_quote(record.get('metrics'))}, not an object"
    return None


def _quote(value: Any) -> str:
    """`value` for a message: missing, or its repr cut to 60 characters."""
    if value is None:
        return "missing"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def read_metrics(path: PathArg, run_id: str | None = None, *, strict: bool = False) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file, in order (only the run `run_id`'s, when given).

    Lines that are not a JSON object (a line torn by a crash, normally the last one) are skipped
    with a ``RuntimeWarning`` giving their count and line numbers. With ``strict``, a JSON object that is
    not a metrics record (``record_problem``) raises ``ValueError`` naming the file, the line and the
    field. Missing file -> ``FileNotFoundError``.
    """
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # includes UnicodeDecodeError from a line cut mid-character
            skipped.append(number)
            continue
        if isinstance(record, dict):
            problem = record_problem(record) if strict else None
            if problem:
                raise ValueError(f"{path} line {number}: {problem}")
            if run_id is None or record.get("run_id") == run_id:
                records.append(record)
        else:
            skipped.append(number)
    if skipped:
        warnings.warn(
            f"{path}: skipped {len(skipped)} unreadable line(s) (torn by a crash?): line(s) {skipped}",
            RuntimeWarning,
            stacklevel=2,
        )
    return records
