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


def _edit_records(run: Path, edit) -> None:
    """Rewrite metrics.jsonl with `edit(record) -> list of records` applied to every record."""
    import json

    lines = (run / "metrics.jsonl").read_text().splitlines()
    out = [json.dumps(new) for line in lines for new in edit(json.loads(line))]
    (run / "metrics.jsonl").write_text("\n".join(out) + "\n")


def test_check_records_only_one_run_has_are_set_aside_and_named(tmp_path, tokenizer, capsys):
    default = Plan().grad_norm
    a = make_run(tmp_path / "a", tokenizer, dataclasses.replace(Plan(), rollouts=3))
    b = make_run(
        tmp_path / "b",
        tokenizer,
        dataclasses.replace(Plan(), rollouts=3, grad_norm=lambda rid, s: 99.0 if s == 5 else default(rid, s)),
    )

    # planted as a resumed --ci-test run differs from a straight one: the straight run's first sync logged the
    # weight-update check before rollout 0's checks; the other run logged no engines-in-sync check
    def first_sync_check(r: dict) -> list[dict]:
        if r["kind"] == "check" and r["rollout_id"] == 0:
            return [{"kind": "check", "rollout_id": 0, "metrics": {"check/weight_update_equal": 1.0}}, r]
        return [r]

    def no_sync_check(r: dict) -> list[dict]:
        if r["kind"] == "check":
            r["metrics"].pop("check/engines_in_sync")
        return [r]

    _edit_records(a, first_sync_check)
    _edit_records(b, no_sync_check)
    assert first_divergence(a, b) == (
        f"rollout 2 metrics: step 5: metric 'train/grad_norm': {default(2, 5)} vs 99.0 (abs diff "
        f"{99.0 - default(2, 5):.3e})"
    )
    assert main(["diff", str(a), str(b)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"first divergence: {first_divergence(a, b)}",
        f"set aside (bookkeeping, not training): 'check/engines_in_sync' only in {a} (rollouts 0-2); "
        f"'check/weight_update_equal' only in {a} (rollout 0)",
    ]
    same = make_run(tmp_path / "same", tokenizer, dataclasses.replace(Plan(), rollouts=3))
    _edit_records(same, no_sync_check)
    assert main(["diff", str(a), str(same)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "identical",
        f"set aside (bookkeeping, not training): 'check/engines_in_sync' only in {a} (rollouts 0-2); "
        f"'check/weight_update_equal' only in {a} (rollout 0)",
    ]


def test_a_check_both_runs_logged_and_a_training_metric_only_one_logged_still_diverge(tmp_path, tokenizer):
    a = make_run(tmp_path / "a", tokenizer, dataclasses.replace(Plan(), rollouts=2))
    b = tmp_path / "b" / "run"
    shutil.copytree(a, b)

    def failed_check(r: dict) -> list[dict]:
        if r["kind"] == "check" and r["rollout_id"] == 1:
            r["metrics"]["check/engines_in_sync"] = 0.0
        return [r]

    _edit_records(b, failed_check)
    assert (
        first_divergence(a, b)
        == "rollout 1 metrics: check record 0: metric 'check/engines_in_sync': 1.0 vs 0.0 (abs diff 1.000e+00)"
    )
    c = tmp_path / "c" / "run"
    shutil.copytree(a, c)

    # a run of a version before rollout/failed_count existed: a difference of training, not bookkeeping
    def older_version(r: dict) -> list[dict]:
        r["metrics"].pop("rollout/failed_count", None)
        return [r]

    _edit_records(c, older_version)
    assert (
        first_divergence(a, c)
        == f"rollout 0 metrics: rollout record 0: metric 'rollout/failed_count' only in {a}"
    )
