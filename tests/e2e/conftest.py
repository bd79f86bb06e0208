"""Fixtures shared by the e2e modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import migrated_home
from tests.e2e.test_resume import _env, _flags, _rollflow


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, prefect_server, base_checkpoint) -> Path:
    """The run dir of an uninterrupted `rollflow run` with test_resume's flags: what a stopped and resumed run of
    the same flags must match. Read, never written, by the tests that use it."""
    tmp = tmp_path_factory.mktemp("straight")
    run_dir = tmp / "straight"
    done = _rollflow(
        ["--name", "straight", *_flags(base_checkpoint, run_dir)], _env(migrated_home(tmp / "prefect"))
    )
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out[-3000:]
    return run_dir
