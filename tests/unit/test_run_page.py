"""The markdown of the run's page in the Prefect UI (flows/run_page.py)."""

from __future__ import annotations

import base64

from flows.doctor import Finding
from flows.run_page import FileLinks, curves_markdown, non_default_flags, progress_text, summary_markdown
from tests.report_records import report_of


def test_summary_shows_status_eval_table_checks_config_and_files(tmp_path):
    report = report_of(tmp_path, 3, 10, {0: 0.42, 2: 0.47}, train={"lr": 0.01}, eval={"eval_interval": 3})
    md = summary_markdown(report)
    lines = md.splitlines()
    assert lines[0] == "# run/t: running"
    assert "| progress | rollout 3 of 10 (30 %), elapsed 6.0 s, ETA 14.0 s |" in lines
    assert lines[lines.index("## Eval") + 2 : lines.index("## Eval") + 7] == [
        "| weights (rollout) | eval/tiny-arith |",
        "|---|---|",
        "| 0 | 0.400 |",
        "| 1 | 0.420 |",
        "| 3 | 0.470 |",
    ]
    assert "- **best eval/tiny-arith: 0.470** at rollout 3 (first 0.400, last 0.470) `▁▃█`" in lines
    assert "| check/engines_in_sync | 3 | - |" in lines
    assert "| optimizer | lr 0.01 cosine, global batch 128 (4 steps per rollout), clip grad 1 |" in lines
    assert "--lr 0.01" in md and "--eval-interval 3" in md and "--num-rollout 10" in md
    run_dir = report.cfg.resolved_run_dir
    # no file server known: the path as code, not a file:// link the UI's http page cannot open
    assert f"| `{run_dir.absolute() / 'metrics.jsonl'}` | every metric record |" in lines
    assert "file://" not in md and "](" not in md.split("## Files", 1)[1]
    assert (
        "## Failure" not in md and "## Doctor" not in md
    )  # no failure, and the doctor ran not (no --ci-test)


def test_summary_of_a_failed_ci_run_has_the_cause_and_the_doctors_findings(tmp_path):
    report = report_of(tmp_path, 1, 4, {}, first_eval=None)
    report.records.append({"kind": "check", "rollout_id": 1, "metrics": {"check/violations": 1.0}})
    report.findings = [
        Finding(
            "error",
            "the KL is not 0 at a first step",
            "ppo_kl = 0.1 at rollout 1 step 2",
            "rollflow replay runs/t --rollout-id 1 --task train-step",
            "first-step-kl",
        )
    ]
    report.finish(
        "failed", "CheckFailed: [KL checker] train/ppo_kl = 0.1 violates |x| < 1e-9 (rollout 1, stage check)"
    )
    md = summary_markdown(report)
    assert md.startswith("# run/t: FAILED\n")
    assert (
        "## Failure\n\n`CheckFailed: [KL checker] train/ppo_kl = 0.1 violates |x| < 1e-9 (rollout 1, stage check)`"
        in md
    )
    assert "| check/violations | 0 | 1 |" in md
    assert "1. **ERROR** [first-step-kl] the KL is not 0 at a first step" in md
    assert "   - confirm: `rollflow replay runs/t --rollout-id 1 --task train-step`" in md
    assert "No eval yet (every 10 rollouts)." in md


def test_curves_markdown_embeds_the_png_as_a_data_uri(tmp_path):
    report = report_of(tmp_path, 1, 1, {})
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    md = curves_markdown(report.cfg, png, 1)
    uri = md.split("](data:image/png;base64,", 1)[1].split(")", 1)[0]
    assert base64.b64decode(uri) == png and md.startswith("# Curves of run/t after 1 rollout\n")
    assert "<svg" not in md  # the UI strips raw SVG; an image it shows


def test_progress_text_and_flags(tmp_path):
    report = report_of(tmp_path, 2, 5, {1: 0.45})
    assert progress_text(report) == "run/t: rollout 2/5 (running), reward 0.310, eval@2 0.450"
    flags = non_default_flags(report.cfg)
    assert "--name t" in flags and "--num-rollout 5" in flags and all(not f.startswith("--lr") for f in flags)


def test_files_link_to_the_file_server_when_it_serves_them(tmp_path):
    report = report_of(tmp_path, 1, 4, {}, checkpoint={"save": str(tmp_path / "elsewhere" / "ckpt")})
    run_dir = report.cfg.resolved_run_dir
    (run_dir / "rollouts").mkdir(parents=True)
    files = FileLinks("http://127.0.0.1:4201", tmp_path.resolve())
    lines = summary_markdown(report, files).splitlines()
    assert "| [metrics.jsonl](http://127.0.0.1:4201/run/metrics.jsonl) | every metric record |" in lines
    assert "| [rollouts](http://127.0.0.1:4201/run/rollouts/) | one Parquet file per rollout |" in lines
    assert "| [checkpoints](http://127.0.0.1:4201/elsewhere/ckpt) | --save |" in lines


def test_files_the_file_server_would_refuse_show_as_paths(tmp_path):
    """A run dir outside the served root, or under a dot-dir of it: the server refuses those, so no link."""
    outside = report_of(tmp_path, 1, 4, {})
    hidden = report_of(tmp_path, 1, 4, {}, run_dir=str(tmp_path / ".cache" / "run"))
    for report, root in ((outside, tmp_path / "other"), (hidden, tmp_path)):
        md = summary_markdown(report, FileLinks("http://127.0.0.1:4201", root.resolve()))
        metrics = report.cfg.resolved_run_dir.absolute() / "metrics.jsonl"
        assert f"| `{metrics}` | every metric record |" in md.splitlines() and "http://" not in md
