"""`rollflow inspect` and `rollflow convert`: look at and translate recordings (ours or slime's)."""

from __future__ import annotations

import argparse
import statistics
import sys

from artifacts.slime_format import SlimeFormatError, convert, read_any
from artifacts.store import ArtifactError

# what a bad or hostile recording raises: each names the file
BAD_FILE = (SlimeFormatError, ArtifactError, ValueError, FileNotFoundError, IsADirectoryError)


def inspect_command(args: argparse.Namespace) -> int:
    """Print per-rollout metrics and the chosen fields of the first samples."""
    try:
        samples = read_any(args.path, trust_pickle=args.trust_pickle)
    except BAD_FILE as e:
        print(f"rollflow: error: {_named(args.path, e)}", file=sys.stderr)
        return 2
    fields = [f for f in args.fields.split(",") if f]
    unknown = [f for f in fields if samples and not hasattr(samples[0], f)]
    if unknown:
        print(f"rollflow: error: --fields: unknown sample field(s) {unknown}", file=sys.stderr)
        return 2
    for rid in sorted({s.rollout_id for s in samples}):
        rows = [s for s in samples if s.rollout_id == rid]
        lengths = [s.response_length for s in rows]
        print(
            f"rollout {rid}: {{'samples': {len(rows)}, 'groups': {len({s.group_index for s in rows})}, "
            f"'rollout/raw_reward': {statistics.fmean(s.reward for s in rows):.4f}, "
            f"'rollout/response_lengths': {statistics.fmean(lengths):.3f}, "
            f"'rollout/truncated_ratio': {sum(s.status == 'truncated' for s in rows) / len(rows):.4f}}}"
        )
    for s in samples[: args.limit]:
        print("  " + "  ".join(f"{f}={getattr(s, f)!r}" for f in fields))
    return 0


def convert_command(args: argparse.Namespace) -> int:
    """Translate a recording; the extensions pick the formats."""
    from pathlib import Path

    from artifacts.atomic import check_writable

    try:
        check_writable(Path(args.dst).absolute().parent)
    except OSError as e:
        print(f"rollflow: error: {args.dst}: cannot be written ({e.strerror or e})", file=sys.stderr)
        return 2
    try:
        rows = convert(args.src, args.dst, trust_pickle=args.trust_pickle)
    except BAD_FILE as e:
        print(f"rollflow: error: {_named(args.src, e)}", file=sys.stderr)
        return 2
    except OSError as e:  # the destination cannot be written
        print(f"rollflow: error: {args.dst}: cannot write it ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"wrote {rows} samples to {args.dst}")
    return 0


def _named(path: str, e: BaseException) -> str:
    """The error as one line that names the file (most errors already start with the path)."""
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, FileNotFoundError | IsADirectoryError) and e.filename:
        text = f"{e.filename}: {e.strerror}"
    return text if str(path) in text else f"{path}: {text}"
