"""The docs' runnable blocks (tests/doc_blocks.py) run as written, one test per page, its blocks in page order in one
scratch directory, so that a page can record a run and then replay it. Each block runs with `bash -e` (a failing
command ends the block with its exit code), `rollflow` on PATH, `$RUNS` a fresh directory of the page's own, and
the test session's Prefect server (PREFECT_API_URL), so no block starts a Prefect server of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import Block, pages_with_blocks

pytestmark = pytest.mark.e2e

PAGES = pages_with_blocks()
BLOCK_TIMEOUT_S = 300


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", block.body],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, output = -1, out + f"\n(killed after {BLOCK_TIMEOUT_S} s)"
    where = f"docs/{block.page}:{block.line} `{block.first_line}`"
    tail = output[-3000:]
    assert code == block.exit, f"{where}: exit {code}, expected {block.exit}; output ends:\n{tail}"
    assert re.search(block.expect, output, re.M), (
        f"{where}: exit {code}, output does not match {block.expect!r}; output ends:\n{tail}"
    )


@pytest.mark.parametrize("page", list(PAGES))
def test_page_commands_run_as_written(page, tmp_path, prefect_server, base_checkpoint):
    from prefect.settings import PREFECT_API_URL

    runs = tmp_path / "runs"
    runs.mkdir()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "RUNS": str(runs),
    }
    for block in PAGES[page]:
        _run(block, tmp_path, env)
