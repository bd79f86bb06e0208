"""Plain-text tables and means for the benches' printouts (no imports: any bench side may use them)."""

from __future__ import annotations


def mean(xs: list[float]) -> float:
    """Arithmetic mean; NaN for an empty list."""
    return sum(xs) / len(xs) if xs else float("nan")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A small left-aligned text table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
