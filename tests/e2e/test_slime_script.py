"""slime's own launch script runs under `rollflow run` with only paths and sizes swapped (bench/slime_compat.py's
swap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifacts.store import RunPaths, read_metrics
from flows.slime_script import train_args

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "slime_scripts" / "scripts"


def test_slimes_qwen3_script_runs_with_paths_and_sizes_swapped(
    tmp_path, ray_session, prefect_server, base_checkpoint, capsys
):
    from bench.slime_compat import PATHS, SIZES, swapped
    from flows.cli import main

    local, was = swapped(train_args(SCRIPTS / "run-qwen3-4B.sh"), tmp_path)
    assert was["--num-layers"] == "36" and was["--tensor-model-parallel-size"] == "2"  # sizes only
    sizes = {
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--num-query-groups",
    }
    sizes |= {"--rotary-base", "--vocab-size", "--kv-channels", *SIZES}
    assert set(was) <= {*PATHS, *sizes}, set(was) - {*PATHS, *sizes}
    run_dir = tmp_path / "run"
    argv = ["run", "--run-dir", str(run_dir), *local]
    assert main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "rollflow: notice: the torch engine ignores --sglang-mem-fraction-static" in err
    records = read_metrics(RunPaths(run_dir).metrics)
    assert sorted({r["rollout_id"] for r in records if r["kind"] == "step"}) == [0, 1]
    assert [r["rollout_id"] for r in records if r["kind"] == "eval"] == [0, 1, 2]  # --eval-interval 1
    saved = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("iter_"))
    assert saved == ["iter_0000000", "iter_0000001"]  # --save-interval 1
