"""--ci-fault-drop-weight: which weights a planted sync bug leaves stale (the engine actor applies it)."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase


def dropped_weights(spec: str | None, names: Iterable[str]) -> list[str]:
    """The weight names `--ci-fault-drop-weight SPEC` selects: SPEC is a comma-separated list of names or
    fnmatch globs (`model.layers.*.mlp.up_proj.weight`). Returns the sorted matches, [] for no SPEC.

    Raises ValueError naming a pattern that matches no weight: a typo would otherwise plant no bug at all,
    and a test relying on the plant would pass for the wrong reason."""
    if not spec:
        return []
    names = sorted(names)
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    matched: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(
                f"--ci-fault-drop-weight {pattern!r} matches no weight of the engine's model "
                f"(e.g. {names[:3]})"
            )
        matched.update(hits)
    return sorted(matched)
