"""The `rollflow doctor` and `rollflow lint-ckpt` commands: print, and exit 0 / 1 (findings) / 2 (bad input)."""

from __future__ import annotations

import sys

from flows.doctor import DoctorInputError, diagnose, exit_code, format_findings


def doctor_command(run_dir: str, strict: bool = False) -> int:
    """Print the ranked findings of `run_dir`; exit 1 when any is an error (with `strict`, also a warning),
    2 when the run directory cannot be read (one line naming the file, no traceback), else 0."""
    try:
        findings = diagnose(run_dir)
    except DoctorInputError as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    print(format_findings(findings, run_dir))
    return exit_code(findings, strict)


def lint_ckpt_command(path: str) -> int:
    """Lint the checkpoint(s) at `path` (artifacts.lint). Print one line per problem, naming the shard, tensor
    or file a `--load` reads, and exit 1. Else print what was checked and exit 0. Exit 2 when `path` holds no
    checkpoint. The `iter_N.tmp-*` dirs of saves that died are named in the summary, never counted."""
    from artifacts.lint import CheckpointNotFound, lint_checkpoint

    try:
        report = lint_checkpoint(path)
    except CheckpointNotFound as e:
        print(f"rollflow: error: {e}", file=sys.stderr)
        return 2
    checked = f"{len(report.dirs)} checkpoint(s), {report.files} file(s), {report.tensors} tensors"
    if report.unverified:  # saved before content hashes: their headers were checked, not their bytes
        checked += f"; {len(report.unverified)} saved without content hashes, not verified"
    if report.unfinished:  # the next run that saves there removes them
        checked += f"; ignored {len(report.unfinished)} unfinished save(s): {', '.join(report.unfinished)}"
    if not report.problems:
        print(f"{path}: ok ({checked})")
        return 0
    for problem in report.problems:
        print(f"{path}: {problem}")
    print(f"{len(report.problems)} problem(s) in {checked}")
    return 1
