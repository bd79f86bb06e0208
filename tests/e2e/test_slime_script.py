"""slime's own launch scripts run under `rollflow run` with only paths and sizes swapped (bench/slime_compat.py's
swap), on both trainer backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifacts.store import RunPaths, read_metrics
from flows.slime_script import train_args

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "slime_scripts" / "scripts"
ARCH_SIZES = {
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--rotary-base",
    "--vocab-size",
    "--kv-channels",
}


def _swapped(script: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The script's train.py arguments with paths and sizes swapped; checks nothing else was."""
    from bench.slime_compat import PATHS, SIZES, swapped

    local, was = swapped(train_args(SCRIPTS / script), tmp_path)
    allowed = {*PATHS, *ARCH_SIZES, *SIZES}
    assert set(was) <= allowed, set(was) - allowed
    return local, was


def _sized(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag`'s value replaced (a size, as the swap sets them)."""
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def _run(argv: list[str], run_dir: Path, capsys) -> str:
    from flows.cli import main

    assert main(["run", "--run-dir", str(run_dir), *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().err


def _rollouts(run_dir: Path, kind: str) -> list[int]:
    return [r["rollout_id"] for r in read_metrics(RunPaths(run_dir).metrics) if r["kind"] == kind]


def _saved(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_"))


def test_slimes_qwen3_script_runs_with_paths_and_sizes_swapped(
    tmp_path, ray_session, prefect_server, base_checkpoint, capsys
):
    local, was = _swapped("run-qwen3-4B.sh", tmp_path)
    assert was["--num-layers"] == "36" and was["--tensor-model-parallel-size"] == "2"  # sizes only
    run_dir = tmp_path / "run"
    err = _run(local, run_dir, capsys)
    assert "rollflow: notice: the torch engine ignores --sglang-mem-fraction-static" in err
    assert sorted(set(_rollouts(run_dir, "step"))) == [0, 1]
    assert _rollouts(run_dir, "eval") == [0, 1, 2]  # --eval-interval 1
    assert _saved(tmp_path / "ckpt") == ["iter_0000000", "iter_0000001"]  # --save-interval 1


def test_slimes_qwen3_script_runs_and_relaunches_on_the_megatron_backend(
    tmp_path, ray_session, prefect_server, base_checkpoint, capsys
):
    """slime's default trainer: the Qwen3 model (q/k layernorm, explicit head_dim) built by megatron-core. The
    script's --load and --save are one dir, so launching it again after it stopped resumes from its checkpoint,
    as slime's relaunch does; the first launch asks for one rollout of the two."""
    local, _ = _swapped("run-qwen3-4B.sh", tmp_path)
    argv = [*local, "--train-backend", "megatron"]
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    _run(_sized(argv, "--num-rollout", "1"), run_dir, capsys)
    assert sorted(set(_rollouts(run_dir, "step"))) == [0]
    assert _rollouts(run_dir, "eval") == [0, 1]
    assert _saved(ckpt) == ["iter_0000000"]

    _run(argv, run_dir, capsys)  # the same command, sizes as swapped: --num-rollout 2
    assert sorted(set(_rollouts(run_dir, "step"))) == [0, 1]  # rollout 0 not trained again
    assert _rollouts(run_dir, "eval") == [0, 1, 2]  # nor evaluated again
    assert len({r.get("run_id") for r in read_metrics(RunPaths(run_dir).metrics)}) == 1  # one run, continued
    assert _saved(ckpt) == ["iter_0000000", "iter_0000001"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (ckpt / "iter_0000001" / "common.pt").is_file()  # megatron's distributed checkpoint


@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_slimes_qwen25_reproducibility_script_runs_with_paths_and_sizes_swapped(
    tmp_path, ray_session, prefect_server, base_checkpoint, capsys, monkeypatch, backend
):
    # the script's --use-wandb, with no W&B account here: offline, by flag (W&B reads WANDB_MODE once per process,
    # and an earlier test of the session may have read it first)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    local, was = _swapped("run-qwen2.5-0.5B-reproducibility.sh", tmp_path)
    assert was["--num-rollout"] == "100" and was["--num-layers"] == "24"  # sizes only
    argv = _sized(local, "--num-rollout", "1")  # one rollout: the other test runs two and a relaunch
    run_dir = tmp_path / "run"
    _run([*argv, "--wandb-mode", "offline", "--train-backend", backend], run_dir, capsys)
    assert sorted(set(_rollouts(run_dir, "step"))) == [0]
    assert _rollouts(run_dir, "eval") == [0, 1]  # --eval-interval 1
