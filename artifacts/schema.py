"""The rollout sample row: the Python dataclass and its Parquet (Arrow) schema.

Versioning rule (DESIGN §3): *add fields, never reinterpret*. A new column may be added (bump
``SCHEMA_VERSION`` only when old readers must refuse the file); an existing column never changes
meaning. Readers therefore ignore columns they do not know and fail loudly, naming the column,
when a column they need is missing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

__all__ = [
    "SAMPLE_FIELDS",
    "SAMPLE_SCHEMA",
    "SAMPLE_STATUSES",
    "SCHEMA_VERSION",
    "Sample",
    "samples_to_table",
    "table_to_samples",
    "validated_table",
]

SCHEMA_VERSION = 1

SAMPLE_STATUSES: tuple[str, ...] = ("completed", "truncated", "aborted", "failed")

SAMPLE_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("rollout_id", pa.int64()),
        pa.field("group_index", pa.int64()),
        pa.field("sample_index", pa.int64()),
        pa.field("prompt", pa.string()),
        pa.field("prompt_tokens", pa.list_(pa.int32())),
        pa.field("response", pa.string()),
        pa.field("response_tokens", pa.list_(pa.int32())),
        pa.field("response_length", pa.int32()),
        pa.field("label", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("status", pa.string()),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("rollout_log_probs", pa.list_(pa.float32())),
        pa.field("weight_version", pa.int64()),
        pa.field("seed", pa.int64()),
        pa.field("metadata", pa.string()),  # JSON text of Sample.metadata
    ]
)

# What each column holds (docs/reference/schema.md is generated from it)
SAMPLE_FIELDS: dict[str, str] = {
    "rollout_id": "The rollout (RL iteration) the sample belongs to.",
    "group_index": "The prompt's group within the rollout: the samples of one prompt share it (GRPO's group).",
    "sample_index": "The sample's index within the rollout, unique in the file.",
    "prompt": "The prompt text the engine was given (after the chat template, with --apply-chat-template).",
    "prompt_tokens": "The prompt's token ids.",
    "response": "The generated text.",
    "response_tokens": "The generated token ids, stop token included.",
    "response_length": "len(response_tokens).",
    "label": "The reference answer the reward compares with.",
    "reward": "The reward of the response.",
    "status": "How generation ended: completed, truncated (length limit), aborted or failed (the reward raised).",
    "loss_mask": "Per response token: 1 trains on it, 0 leaves it out (e.g. a tool's output).",
    "rollout_log_probs": "Per response token: the engine's log-prob of it (float32); empty when unknown.",
    "weight_version": "The weight version the engine generated with.",
    "seed": "The sample's sampling seed, derived from --rollout-seed, the rollout id and the sample index.",
    "metadata": "The prompt row's metadata as JSON text (e.g. the eval set's name).",
}
if list(SAMPLE_FIELDS) != SAMPLE_SCHEMA.names:
    raise AssertionError("SAMPLE_FIELDS must describe SAMPLE_SCHEMA's columns in their order")

_INT32_MAX = 2**31 - 1


# Sorted keys and fixed separators: equal dicts give equal bytes, hence equal file hashes.
# allow_nan=False: the column is JSON text for any reader (duckdb, pandas), and NaN is not JSON.
# One encoder for every row (json.dumps with options builds a new one per call: a third of its cost on small dicts).
_METADATA_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _metadata_json(metadata: dict[str, Any]) -> str:
    return _METADATA_ENCODER.encode(metadata)


@dataclasses.dataclass
class Sample:
    """One generated response to one prompt: one row of a rollout Parquet file.

    Field meanings follow slime's ``Sample``. ``loss_mask``, ``rollout_log_probs`` and
    ``response_tokens`` are aligned per response token. ``rollout_log_probs`` are the inference
    engine's log-probs, stored as float32 (values that are float32 to begin with, e.g. from
    ``tensor.tolist()``, round-trip bitwise); it may be empty when unknown. ``metadata`` must be
    a JSON-representable dict (str keys, no tuples, no NaN) because it is stored as JSON text.
    """

    rollout_id: int
    group_index: int
    sample_index: int
    prompt: str
    prompt_tokens: list[int]
    response: str
    response_tokens: list[int]
    response_length: int
    label: str
    reward: float
    status: str
    loss_mask: list[int]
    rollout_log_probs: list[float]
    weight_version: int
    seed: int
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def validate(self) -> None:
        """Check the row's invariants; raise ``ValueError`` naming the offending field.

        Checked: field types; ids non-negative; ``status`` in ``SAMPLE_STATUSES``;
        ``len(response_tokens) == response_length == len(loss_mask)`` and the same for
        ``rollout_log_probs`` unless it is empty; token ids in ``[0, 2**31)``; ``loss_mask``
        values in {0, 1}; ``metadata`` survives a JSON round trip unchanged.
        """
        for name in (
            "rollout_id",
            "group_index",
            "sample_index",
            "response_length",
            "weight_version",
            "seed",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"Sample.{name} must be an int, got {type(value).__name__}")
        for name in ("rollout_id", "group_index", "sample_index", "response_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"Sample.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("prompt", "response", "label", "status"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"Sample.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.reward, (int, float)) or isinstance(self.reward, bool):
            raise ValueError(f"Sample.reward must be a float, got {type(self.reward).__name__}")
        if self.status not in SAMPLE_STATUSES:
            raise ValueError(f"Sample.status must be one of {SAMPLE_STATUSES}, got {self.status!r}")

        n = self.response_length
        if len(self.response_tokens) != n:
            raise ValueError(
                f"Sample.response_tokens has {len(self.response_tokens)} tokens but response_length is {n}"
            )
        if len(self.loss_mask) != n:
            raise ValueError(f"Sample.loss_mask has {len(self.loss_mask)} entries but response_length is {n}")
        if self.rollout_log_probs and len(self.rollout_log_probs) != n:
            raise ValueError(
                f"Sample.rollout_log_probs has {len(self.rollout_log_probs)} entries but response_length is {n}"
                " (use an empty list when unknown)"
            )

        for name in ("prompt_tokens", "response_tokens"):
            tokens: Sequence[int] = getattr(self, name)
            if tokens and (min(tokens) < 0 or max(tokens) > _INT32_MAX):
                raise ValueError(
                    f"Sample.{name} has token ids outside [0, 2**31): min {min(tokens)}, max {max(tokens)}"
                )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"Sample.loss_mask values must be 0 or 1, got {sorted(set(self.loss_mask))}")

        if not isinstance(self.metadata, dict):
            raise ValueError(f"Sample.metadata must be a dict, got {type(self.metadata).__name__}")
        try:
            round_tripped = json.loads(_metadata_json(self.metadata))
        except (TypeError, ValueError) as e:
            raise ValueError(f"Sample.metadata is not JSON-serialisable: {e}") from e
        if round_tripped != self.metadata:
            raise ValueError(
                "Sample.metadata changes in a JSON round trip (tuples or non-str keys?); use lists and str keys"
            )


# table_to_samples builds each Sample by position
if [f.name for f in dataclasses.fields(Sample)] != SAMPLE_SCHEMA.names:
    raise AssertionError("SAMPLE_SCHEMA must list Sample's fields in their order")


def samples_to_table(samples: Iterable[Sample]) -> pa.Table:
    """Convert samples to a table with exactly ``SAMPLE_SCHEMA`` (no validation; see ``Sample.validate``).

    Raises ``ValueError`` naming the column when a value cannot be converted to its Arrow type.
    """
    samples = list(samples)
    arrays = []
    for field in SAMPLE_SCHEMA:
        if field.name == "metadata":
            values: list[Any] = [_metadata_json(s.metadata) for s in samples]
        else:
            values = [getattr(s, field.name) for s in samples]
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
            raise ValueError(f"column {field.name!r} cannot be converted to {field.type}: {e}") from e
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)


_INT_FIELDS = ("rollout_id", "group_index", "sample_index", "response_length", "weight_version", "seed")
_STR_FIELDS = ("prompt", "response", "label", "status")
_JSON_SCALARS = (str, int, float, bool, type(None))
# Below this many samples the per-sample checks cost less than the column-wise ones' fixed cost (bench/HISTORY.md).
COLUMN_WISE_FROM = 128


def validated_table(samples: Sequence[Sample]) -> pa.Table:
    """`samples` as a ``SAMPLE_SCHEMA`` table, each checked as `Sample.validate` checks it: a sample is refused
    exactly when `validate` refuses it, and the first such sample raises `validate`'s own ``ValueError``, prefixed
    with its position and ids. From `COLUMN_WISE_FROM` samples up the checks run column-wise (Python types per
    column, the row invariants in Arrow: `_row_problem`), each sample's metadata serialised once. Only when one
    fails are the samples validated one by one, for the message."""
    table = None
    if len(samples) >= COLUMN_WISE_FROM:
        try:
            table = samples_to_table(samples)
        except (TypeError, ValueError):  # e.g. metadata that is not JSON, a value Arrow cannot convert
            table = None
        if table is not None and _plain_columns(samples) and _row_problem(table) is None:
            return table
    _validate_each(samples)
    # every sample is valid: the table built above stands (a conversion error, e.g. an int past int64, raises here)
    return samples_to_table(samples) if table is None else table


def _validate_each(samples: Sequence[Sample]) -> None:
    """`Sample.validate` on each sample in order; the first failure raises, prefixed with its position and ids."""
    for position, sample in enumerate(samples):
        try:
            sample.validate()
        except ValueError as e:
            raise ValueError(
                f"sample {position} (rollout_id={sample.rollout_id!r}, group_index={sample.group_index!r}, "
                f"sample_index={sample.sample_index!r}): {e}"
            ) from e


def _plain_columns(samples: Sequence[Sample]) -> bool:
    """Whether every sample's fields have the plain types `Sample.validate` accepts (exact ints, strs, float or
    int rewards; a False here only means "validate one by one"), non-negative token ids below 2**31, and
    metadata that a JSON round trip keeps unchanged (str keys; lists, dicts and scalars; finite floats)."""
    for name in _INT_FIELDS:
        if {type(getattr(s, name)) for s in samples} - {int}:
            return False
    for name in _STR_FIELDS:
        if {type(getattr(s, name)) for s in samples} - {str}:
            return False
    if {type(s.reward) for s in samples} - {float, int}:
        return False
    for s in samples:
        for tokens in (s.prompt_tokens, s.response_tokens):
            if tokens and (min(tokens) < 0 or max(tokens) > _INT32_MAX):
                return False
        if type(s.metadata) is not dict or not _plain_json(s.metadata):
            return False
    return True


def _plain_json(value: Any) -> bool:
    """Whether `value` survives a JSON round trip unchanged, decided by its types (a sufficient condition)."""
    kind = type(value)
    if kind is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    if kind is list:
        return all(_plain_json(v) for v in value)
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    return kind in _JSON_SCALARS


def table_to_samples(table: pa.Table) -> list[Sample]:
    """Convert a table with (at least) the ``SAMPLE_SCHEMA`` columns back to samples.

    Extra columns are ignored (a newer writer may have added them). A missing required column,
    a null in a required column, or a column that cannot be cast losslessly to its schema type
    raises ``ValueError`` naming the column.
    """
    missing = [name for name in SAMPLE_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(
            f"rollout table is missing required column(s) {missing}; it has {table.column_names}"
        )

    columns: dict[str, list[Any]] = {}
    for field in SAMPLE_SCHEMA:
        column = table.column(field.name)
        if column.null_count:
            raise ValueError(
                f"column {field.name!r} has {column.null_count} null value(s); samples need a value"
            )
        if not column.type.equals(field.type):
            if not _same_family(column.type, field.type):
                raise ValueError(
                    f"column {field.name!r} has type {column.type}, but the schema says {field.type}"
                )
            try:
                column = column.cast(field.type, safe=True)  # safe: refuse overflow / truncation
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise ValueError(
                    f"column {field.name!r} has type {column.type}, not castable to {field.type}: {e}"
                ) from e
        columns[field.name] = column.to_pylist()

    metadata_column = columns["metadata"]
    for row, text in enumerate(metadata_column):
        try:
            metadata_column[row] = json.loads(text)
        except ValueError as e:
            raise ValueError(f"column 'metadata' row {row} is not valid JSON: {e}") from e
        if not isinstance(metadata_column[row], dict):
            raise ValueError(
                f"column 'metadata' row {row} is JSON {type(metadata_column[row]).__name__}, not an object"
            )

    _check_rows(table)
    # positional: SAMPLE_SCHEMA lists Sample's fields in their order (checked at import, below Sample)
    return [Sample(*values) for values in zip(*(columns[n] for n in SAMPLE_SCHEMA.names), strict=True)]


def _check_rows(table: pa.Table) -> None:
    """Raise a ``ValueError`` naming the column and row of the first row that breaks `_row_problem`'s checks."""
    problem = _row_problem(table)
    if problem is not None:
        raise ValueError(problem)


def _row_problem(table: pa.Table) -> str | None:
    """The per-row invariants of `Sample.validate`, checked column-wise in Arrow (cheaper than sample by sample
    for a large rollout): aligned per-token lists, 0/1 loss mask, known statuses, non-negative ids.
    What the first failure is (its column and row), or None when all hold."""
    import pyarrow.compute as pc

    n = table.column("response_length")

    def first_bad(mask: pa.ChunkedArray) -> int | None:
        bad = pc.indices_nonzero(pc.invert(pc.fill_null(mask, False)))
        return int(bad[0].as_py()) if len(bad) else None

    checks = [
        (
            "response_tokens",
            pc.equal(pc.list_value_length(table.column("response_tokens")), n),
            "has a length other than response_length",
        ),
        (
            "loss_mask",
            pc.equal(pc.list_value_length(table.column("loss_mask")), n),
            "has a length other than response_length",
        ),
        (
            "rollout_log_probs",
            pc.or_(
                pc.equal(pc.list_value_length(table.column("rollout_log_probs")), n),
                pc.equal(pc.list_value_length(table.column("rollout_log_probs")), 0),
            ),
            "is neither empty nor response_length long",
        ),
        (
            "status",
            pc.is_in(table.column("status"), value_set=pa.array(SAMPLE_STATUSES)),
            f"is not one of {SAMPLE_STATUSES}",
        ),
    ]
    for name in ("rollout_id", "group_index", "sample_index", "response_length"):
        checks.append((name, pc.greater_equal(table.column(name), 0), "is negative"))
    flat_mask = pc.list_flatten(table.column("loss_mask"))
    if len(flat_mask) and not pc.all(pc.is_in(flat_mask, value_set=pa.array([0, 1], pa.int8()))).as_py():
        return "column 'loss_mask' holds values other than 0 and 1"
    for name, ok, what in checks:
        row = first_bad(ok)
        if row is not None:
            return f"column {name!r} row {row} {what}"
    return None


def _same_family(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether `found` may be cast to `wanted` without reinterpreting it: integer to integer, float to float,
    string to string, list to list of such (text holding numbers is not a number column)."""
    t = pa.types
    for kind in (t.is_integer, t.is_floating, lambda x: t.is_string(x) or t.is_large_string(x)):
        if kind(wanted):
            return bool(kind(found))
    if t.is_list(wanted):
        return (t.is_list(found) or t.is_large_list(found)) and _same_family(
            found.value_type, wanted.value_type
        )
    return found.equals(wanted)
