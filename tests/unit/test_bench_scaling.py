"""bench/scaling.py's arithmetic: the log-log fit, the growth per size and per length, the table and the targets,
on synthetic cells whose times follow known powers; and its memory poll on this process."""

from __future__ import annotations

import argparse
import os

import pytest

from bench._memory import PeakMemory
from bench.scaling import (
    HEADER,
    Cell,
    _grid,
    cell_lines,
    cell_plan,
    fit_lines,
    growth,
    loglog_slope,
    markdown,
    report,
    row,
    targets,
)


def test_slope_of_a_power_law_is_its_exponent():
    points = [(x, 3.0 * x**1.5) for x in (64, 256, 1024)]
    assert loglog_slope(points) == pytest.approx(1.5, abs=1e-9)
    assert loglog_slope([(64, 2.0), (256, 2.0)]) == pytest.approx(0.0, abs=1e-12)


def test_slope_needs_two_distinct_x():
    assert loglog_slope([(64, 1.0)]) is None
    assert loglog_slope([(64, 1.0), (64, 2.0)]) is None
    assert loglog_slope([]) is None


N = 8  # samples a step in the synthetic cells


def synthetic(size: str, params: int, length: int, trl_factor: float = 2.5) -> Cell:
    """A measured cell whose stage seconds grow as length^1 x params^0.5 (sync as params^1, length^0)."""
    scale = length * (params / 1e6) ** 0.5 / 1000
    gen = 2.0 * scale
    perf = {
        "perf/rollout_time": [gen, gen],
        "perf/tokens_per_sec": [N * length / gen] * 2,
        "perf/log_probs_time": [1.0 * scale] * 2,
        "perf/actor_train_time": [3.0 * scale] * 2,
        "perf/step_time": [6.5 * scale] * 2,
    }
    cell = Cell(size, f"recipe-{size}", length, params=params)
    cell.rollflow = {"n": N, "perf": perf, "sync": [0.01 * params / 1e6] * 2, "seconds": 100.0}
    cell.trl = [99.0, trl_factor * 6.5 * scale]
    cell.trl_peak_gib = 8.0
    cell.hf = {"engine_tps": 200.0, "hf_tps": 80.0, "hf_seconds": 4.0 * scale, "dtype": "bfloat16"}
    cell.hf["pair_ratios"] = [2.6, 1.9, 2.5]  # engine/HF is their median, not the totals' ratio
    cell.hf.update(rows=N, products_s=N / 400.0)  # a ceiling of 400 tok/s
    cell.mem = {
        "driver (rollflow side)": 0.5,
        "ray::trainer-0:TrainerActor": 5.0,
        "ray::engine-0:EngineActor": 1.5,
    }
    cell.mem_concurrent_gib = 6.0
    cell.mem_at_peak = {
        "ray::trainer-0:TrainerActor": 4.5,
        "driver (rollflow side)": 0.4,
        "ray::engine-0:EngineActor": 1.1,
    }
    return cell


CELLS = [
    synthetic(size, params, length)
    for size, params in (("3.2M", 3_200_000), ("0.5B", 500_000_000))
    for length in (64, 256, 1024)
]


def test_growth_with_length_and_size_recovers_the_exponents():
    by_length = {key: fits for key, _, fits in growth(CELLS, "length")}
    assert list(by_length) == ["3.2M", "0.5B"]
    for fits in by_length.values():
        for stage in ("generate", "log-prob", "train", "rollout", "TRL step", "HF generate"):
            slope, used = fits[stage]
            assert slope == pytest.approx(1.0, abs=1e-9), stage
        assert fits["sync"][0] == pytest.approx(0.0, abs=1e-9)
    assert by_length["0.5B"]["train"][1] == ["0.5Bx64", "0.5Bx256", "0.5Bx1024"]
    by_size = {key: fits for key, _, fits in growth(CELLS, "size")}
    assert list(by_size) == ["64", "256", "1024"]
    for fits in by_size.values():
        assert fits["train"][0] == pytest.approx(0.5, abs=1e-9)
        assert fits["sync"][0] == pytest.approx(1.0, abs=1e-9)
        assert fits["train"][1] == [c for c in fits["train"][1]]  # the cells named in the order measured


def test_a_stage_measured_in_one_cell_only_has_no_slope():
    cells = [synthetic("0.5B", 500_000_000, 64), synthetic("0.5B", 500_000_000, 256)]
    cells[1].trl = []  # TRL did not run there
    fits = growth(cells, "length")[0][2]
    assert fits["TRL step"] == (None, ["0.5Bx64"])
    assert not any("TRL step" in line for line in fit_lines(cells))
    assert any(
        line.startswith("size 0.5B: train time ~ (mean response tokens)^1.00") for line in fit_lines(cells)
    )


def args(**over: object) -> argparse.Namespace:
    base = dict(
        prompts=2, group=4, steps=2, threads=1, precision="auto", run_flags="", note="other work on the CPU"
    )
    return argparse.Namespace(**{**base, **over})


def test_table_row_ratios_and_targets():
    cell = next(c for c in CELLS if c.size == "0.5B" and c.length == 256)
    r = dict(zip(HEADER, row(cell), strict=True))
    assert r["rollflow/TRL"] == f"{1 / 2.5:.2f}x"
    assert r["engine/HF"] == "2.50x"
    assert r["rollflow peak GiB (at once / sum / max proc)"] == "6.00 / 7.00 / 5.00"
    assert r["resp tok"] == "256"
    lines = targets(CELLS)
    assert "RL step / TRL's <= 0.5x: 0.40x -> met" in lines[1]
    assert "engine / HF generate >= 2x (median pair): 2.50x -> met" in lines[2]
    assert "peak memory" in lines[4] and "0.75x TRL's -> met" in lines[4]
    slow = synthetic("0.5B", 500_000_000, 256, trl_factor=1.5)
    assert "NOT met" in targets([slow])[1]
    # one fast pair does not carry the engine target: the median does (the totals here are 2.5x)
    slow.hf["pair_ratios"] = [1.9, 3.4, 1.95]
    assert row(slow)[HEADER.index("engine/HF")] == "1.95x"
    assert "engine / HF generate >= 2x (median pair): 1.95x -> NOT met" in targets([slow])[2]
    assert any(
        "by timed pair (the engine's call first in pairs 1, 3, ...): 1.90x, 3.40x, 1.95x; median 1.95x"
        in line
        for line in cell_lines(slow)
    )
    assert targets(CELLS[:3]) == ["targets (0.5B x 256): not measured in this invocation"]


def test_cells_in_the_order_given_and_the_table_by_size_then_length():
    recipes = ["long-arith", "long-arith-0.5b", "tiny-arith"]
    assert cell_plan("3.2M,0.5B", "64,256", None, recipes) == [
        ("3.2M", 64),
        ("3.2M", 256),
        ("0.5B", 64),
        ("0.5B", 256),
    ]
    plan = cell_plan("", "", "0.5Bx256,3.2Mx64,tiny-arithx8", recipes)
    assert plan == [("0.5B", 256), ("3.2M", 64), ("tiny-arith", 8)]
    assert _grid(plan) == [("3.2M", 64), ("0.5B", 256), ("tiny-arith", 8)]
    assert _grid([("3.2M", 256), ("0.5B", 64), ("3.2M", 64)]) == [("3.2M", 64), ("3.2M", 256), ("0.5B", 64)]
    with pytest.raises(ValueError, match="unknown size or recipe '7B'"):
        cell_plan("7B", "64", None, recipes)
    with pytest.raises(ValueError, match="expected SIZExLENGTH"):
        cell_plan("", "", "0.5B-256", recipes)
    with pytest.raises(ValueError, match="positive token count"):
        cell_plan("3.2M", "0", None, recipes)


def test_report_and_results_file_render():
    text = report(args(), CELLS)
    assert "Fitted growth" in text and "0.5Bx1024" in text and "other work on the CPU" in text
    page = markdown(args(), CELLS)
    head, _, body = page.partition("\n---\n")
    assert head.startswith("---\ntitle: ") and "\nmeasured: " in head and "\nmachine: " in head
    assert "| cell | params |" in body and body.count("\n| 0.5Bx") == 3
    # what the run held at its highest, largest first, and the engine's ceiling from its weight products alone
    assert "at the run's highest, Pss GiB by process: ray::trainer-0:TrainerActor 4.50, ray::engine-0" in text
    assert "a ceiling of 400 tok/s = 5.00x HF generate" in text


def test_peak_memory_reads_this_process():
    memory = PeakMemory(os.getpid())
    memory.poll()
    peaks = memory.stop()
    assert len(peaks) >= 1 and all(v > 0 for v in peaks.values())
    assert memory.concurrent > 0 and sum(memory.at_peak.values()) == pytest.approx(memory.concurrent)


def test_the_runs_weight_sync_files_count_in_its_memory(monkeypatch, tmp_path):
    """A sync's bucket files in shared memory belong to the run whose process named their directory."""
    from bench import _memory
    from tasks import transfer

    monkeypatch.setattr(transfer, "SHARED_MEMORY", tmp_path)
    for pid in (os.getpid(), 1):  # this process's, and another's that is not in the tree polled
        d = tmp_path / f"{transfer.SYNC_FILES_PREFIX}{pid}-abc"
        d.mkdir()
        (d / "0.bin").write_bytes(b"x" * (1 << 20))
    memory = PeakMemory(os.getpid())
    memory.poll()
    assert memory.at_peak[_memory.SYNC_FILES] == pytest.approx(1 / 1024, rel=0.01)


def test_the_rollflow_side_imports_no_model_code_a_runs_driver_does_not(tmp_path):
    """The rollflow side's process is the run's driver and is counted in the run's memory: what the bench
    imports there (here, the in-process plain loop's engine and trainer, with transformers' modeling code)
    would be counted as the run's own."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys; sys.argv = ['scaling.py']\n"
        "import bench.scaling, bench._flow_run\n"
        "print(sorted(m for m in ('engines.torch_engine.engine', 'trainers.torch_trainer.trainer', "
        "'transformers.modeling_utils', 'bench._plain_loop') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)},  # the bench's own temp dir
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]", done.stdout
