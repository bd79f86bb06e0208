"""`rollflow diff` compares what both runs have before reporting what one of them lacks (synthetic runs)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from artifacts.store import read_rollout, write_rollout
from flows.cli import main
from flows.diff import first_divergence
from tests.doctor_runs import Plan, make_run, tokenizer_dir


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("tok"))


def _stop_after(run: Path, last: int) -> None:
    """Make `run` look like a run that stopped after rollout `last`: later recordings and records removed."""
    import json

    for p in (run / "rollouts").glob("*.parquet"):
        if int(p.stem.split("_")[1]) > last:
            p.unlink()
    lines = [
        line
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["rollout_id"] <= last
    ]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_run_that_stopped_early_is_compared_on_the_rollouts_both_have(tmp_path, tokenizer, capsys):
    clean = make_run(tmp_path / "clean", tokenizer, dataclasses.replace(Plan(), rollouts=4))
    stopped = tmp_path / "stopped" / "run"
    shutil.copytree(clean, stopped)
    _stop_after(stopped, 1)
    assert first_divergence(clean, stopped) == (
        f"rollouts 0-1 are identical in both; {stopped} lacks rollout(s) "
        f"2-3 that {clean} has (stopped early: a checker, a crash or "
        "--debug-exit-after-rollout?)"
    )
    # a planted change in a rollout both have: named by its column, not hidden behind the missing rollouts
    path = stopped / "rollouts" / "rollout_000001.parquet"
    samples = read_rollout(path)
    samples[5] = dataclasses.replace(
        samples[5],
        response_tokens=[4, 1],
        response_length=2,
        loss_mask=[1, 1],
        rollout_log_probs=[-0.5, -0.6],
    )
    write_rollout(path, samples)
    assert first_divergence(clean, stopped).startswith(
        "rollout 1 samples: column 'response_tokens', sample_index 5"
    )
    assert main(["diff", str(clean), str(stopped)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"first divergence: {first_divergence(clean, stopped)}",
        f"also: {stopped} lacks rollout(s) 2-3",
    ]


def test_records_are_matched_by_step_and_the_missing_step_is_named(tmp_path, tokenizer):
    a = make_run(tmp_path / "a", tokenizer, dataclasses.replace(Plan(), rollouts=2))
    b = tmp_path / "b" / "run"
    shutil.copytree(a, b)
    lines = (b / "metrics.jsonl").read_text().splitlines()
    (b / "metrics.jsonl").write_text("\n".join(x for x in lines if '"step": 3' not in x) + "\n")
    assert first_divergence(a, b) == f"rollout 1 metrics: step 3 only in {a}; {b} lacks it"
    assert first_divergence(a, a) is None


def test_a_metric_that_differs_at_a_common_step_is_named(tmp_path, tokenizer):
    default = Plan().grad_norm
    a = make_run(tmp_path / "a", tokenizer, dataclasses.replace(Plan(), rollouts=3))
    b = make_run(
        tmp_path / "b",
        tokenizer,
        dataclasses.replace(Plan(), rollouts=2, grad_norm=lambda rid, s: 99.0 if s == 3 else default(rid, s)),
    )
    assert first_divergence(a, b) == (
        f"rollout 1 metrics: step 3: metric 'train/grad_norm': {default(1, 3)} vs "
        f"99.0 (abs diff {99.0 - default(1, 3):.3e})"
    )
