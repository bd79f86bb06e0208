"""bench/scaling.py end to end at smoke size: one tiny-arith cell (a real 2-rollout run over Ray with its own
Prefect server, HF generate beside the engine, TRL where this interpreter has it) prints its table, the memory of
the run's processes and the results file."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_one_tiny_cell_prints_its_table(tmp_path, prefect_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "PREFECT_API"))}
    env.update(ROLLFLOW_BENCH_PREFECT_HOME=str(prefect_home), PYTHONPATH=str(ROOT))
    saved = tmp_path / "scaling.md"
    cmd = [sys.executable, str(ROOT / "bench" / "scaling.py"), "--sizes", "tiny-arith", "--lengths", "8"]
    cmd += ["--steps", "2", "--precision", "fp32", "--save", str(saved)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    if importlib.util.find_spec("trl") is None:
        assert "TRL side skipped: trl is not importable by this interpreter" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("cell "))
    cells = lines[header + 2].split()
    assert cells[0] == "tiny-arithx8" and cells[1] == "0.3M"
    # response tokens, generate, log-prob, train, sync, rollout seconds and the engine's tokens/s in the run
    assert all(c not in ("-", "") for c in cells[2:9]), lines[header + 2]
    assert "peak GiB by process: driver (rollflow side)" in text and "ray::TrainerActor" in text
    assert "at the run's highest, Pss GiB by process: " in text
    assert "the engine's weight products alone, one decode step of 8 rows: " in text
    # engine/HF is the median of three timed pairs, each pair's ratio listed
    pairs = next(line for line in lines if "engine/HF tokens/s by timed pair" in line)
    assert pairs.count("x, ") == 2 and "; median " in pairs, pairs
    assert "Fitted growth" in text
    page = saved.read_text()
    assert page.startswith("---\ntitle: ") and "| tiny-arithx8 | 0.3M |" in page


def test_generate_repeats_below_one_is_refused():
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "scaling.py"),
        "--sizes",
        "tiny-arith",
        "--generate-repeats",
        "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--generate-repeats must be >= 1" in out.stderr, out.stderr
