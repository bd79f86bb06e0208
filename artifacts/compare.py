"""Finding the first difference between two recordings, two metric logs or two sets of layer hashes.

Every function returns None when the inputs are identical (bit for bit for floats) and otherwise
one line naming where they first differ, so a replay or a diff can print it as is.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa


def _max_abs_diff(a: Any, b: Any) -> float | None:
    """Max |a - b| over numbers or equal-length numeric lists; None when not comparable numerically."""
    try:
        if isinstance(a, int | float) and isinstance(b, int | float):
            return abs(float(a) - float(b))
        if (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and a
            and all(isinstance(x, int | float) for x in a + b)
        ):
            return max(abs(float(x) - float(y)) for x, y in zip(a, b, strict=True))
    except OverflowError:  # a JSON int beyond a float's range (a damaged metrics.jsonl)
        return None
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def first_table_difference(original: pa.Table, replayed: pa.Table, key: str = "sample_index") -> str | None:
    """First (column, row) where two tables differ; rows are matched by `key` when both have it."""
    if set(original.column_names) != set(replayed.column_names):
        return f"columns differ: {sorted(set(original.column_names) ^ set(replayed.column_names))}"
    a, b = original.to_pylist(), replayed.to_pylist()
    if len(a) != len(b):
        return f"row count differs: {len(a)} vs {len(b)}"
    if key in original.column_names:
        a, b = sorted(a, key=lambda r: r[key]), sorted(b, key=lambda r: r[key])
    for column in original.column_names:
        for ra, rb in zip(a, b, strict=True):
            if not _same(ra[column], rb[column]):
                where = f"{key} {ra[key]}" if key in ra else "row"
                diff = _max_abs_diff(ra[column], rb[column])
                extra = f", max abs diff {diff:.3e}" if diff is not None else ""
                return f"column {column!r}, {where}: {_short(ra[column])} vs {_short(rb[column])}{extra}"
    return None


def first_metric_difference(
    original: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    names: tuple[str, str] = ("original", "replay"),
) -> str | None:
    """First metric that differs between two lists of metric dicts (e.g. one per optimizer step); a metric only
    one side has is named with that side's name from `names`."""
    if len(original) != len(replayed):
        return f"number of records differs: {len(original)} vs {len(replayed)}"
    for i, (ma, mb) in enumerate(zip(original, replayed, strict=True)):
        for k in sorted(set(ma) | set(mb)):
            if k not in ma or k not in mb:
                return f"record {i}: metric {k!r} only in {names[0] if k in ma else names[1]}"
            if not _same(ma[k], mb[k]):
                diff = _max_abs_diff(ma[k], mb[k])
                extra = f" (abs diff {diff:.3e})" if diff is not None else ""
                return f"record {i}: metric {_short(k)}: {_short(ma[k])} vs {_short(mb[k])}{extra}"
    return None


def first_layer_difference(original: dict[str, str], replayed: dict[str, str]) -> str | None:
    """First layer whose hash differs (layer names in sorted order)."""
    for layer in sorted(set(original) | set(replayed)):
        if original.get(layer) != replayed.get(layer):
            return f"layer {layer!r}: hash {str(original.get(layer))[:12]} vs {str(replayed.get(layer))[:12]}"
    return None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
