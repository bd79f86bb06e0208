"""The console of `rollflow run` (flows/console.py) and the run report behind it (flows/report.py)."""

from __future__ import annotations

import io
import logging

import pytest

from flows.console import (
    MAX_ROLLOUT_LINES,
    Console,
    ProgressConsole,
    VerboseConsole,
    _QuietFilter,
    duration,
    eval_table,
    number,
    open_console,
    prints_line,
    rollout_line,
    sparkline,
    summary,
)
from flows.doctor import Finding
from tasks import notify
from tests.report_records import Clock, records_of, report_of


def test_numbers_durations_and_sparklines():
    assert [duration(s) for s in (None, 0.04, 59.94, 185, 7440)] == ["-", "0.0 s", "59.9 s", "3m05s", "2h04m"]
    assert [
        number(None),
        number(0.52349),
        number(4.7123, "sig"),
        number(0.00312, "sci"),
        number(0.0, "sci"),
    ] == ["-", "0.523", "4.71", "3.1e-03", "0"]
    assert sparkline([0.4, 0.5, 0.7]) == "▁▃█" and sparkline([1.0, 1.0]) == "▄▄" and sparkline([]) == ""


def test_report_numbers_of_a_rollout(tmp_path):
    report = report_of(tmp_path, 3, 10, {1: 0.45})
    one = report.rollout(1)
    assert (one.reward, one.kl, one.grad_norm, one.entropy, one.length, one.seconds) == (
        0.31,
        0.001,
        5.0,
        0.5,
        4.25,
        2.0,
    )
    assert one.evals == [(2, {"eval/tiny-arith": 0.45})]  # eval 2 runs in rollout 1's flow, on its weights
    assert report.rollout(0).evals == [(0, {"eval/tiny-arith": 0.4})]
    assert report.done == 3 and report.eta() == pytest.approx(7 * 2.0)
    assert report.best_eval("eval/tiny-arith") == (2, 0.45) and report.last_eval() == (
        2,
        {"eval/tiny-arith": 0.45},
    )
    assert [(c.name, c.passed, c.failed_at) for c in report.checks()] == [
        ("check/finite_metrics", 3, []),
        ("check/engines_in_sync", 3, []),
    ]


def test_report_keeps_only_its_run_dirs_records(tmp_path):
    report = report_of(tmp_path, 1, 2, {})
    before = len(report.records)
    report.on_record(tmp_path / "elsewhere", records_of(1, 0.9)[0])
    report.on_record(report.cfg.resolved_run_dir, records_of(1, 0.9)[1])
    assert len(report.records) == before + 1 and report.rollout(1).reward == 0.9


def test_rollout_line_is_one_concise_line(tmp_path):
    report = report_of(tmp_path, 2, 100, {1: 0.45})
    assert rollout_line(report.rollout(1), report.total, report.eta()) == (
        "rollout   2/100  reward 0.310  kl 1.0e-03  entropy 0.500  grad 5  len 4.25  2.0 s  ETA 3m16s  "
        "eval@2 0.450"
    )


def test_a_long_run_prints_at_most_about_max_lines_and_every_eval(tmp_path):
    evals = {rid: 0.5 for rid in range(9, 100, 10)}
    report = report_of(tmp_path, 100, 100, evals)
    printed = [rid for rid in range(100) if prints_line(report, rid)]
    assert set(evals) <= set(printed) and 99 in printed and 0 in printed
    assert len(printed) <= MAX_ROLLOUT_LINES + len(evals)
    short = report_of(tmp_path, 5, 5, {})
    assert [rid for rid in range(5) if prints_line(short, rid)] == [0, 1, 2, 3, 4]


def test_eval_table_keeps_first_last_and_best_rows(tmp_path):
    evals = {rid: 0.5 + 0.001 * rid for rid in range(30)}
    evals[13] = 0.9  # the best, off the even spread
    report = report_of(tmp_path, 30, 30, evals)
    table = eval_table(report)
    versions = [int(line.split()[0]) for line in table[1:-1]]
    assert table[0].split() == ["weights", "eval/tiny-arith"] and len(versions) == 12
    assert {0, 14, 30} <= set(versions) and versions == sorted(versions)
    assert table[-1] == "(12 of 31 evals; all of them in metrics.jsonl)"


def test_summary_table_of_a_completed_and_a_failed_run(tmp_path):
    report = report_of(tmp_path, 3, 3, {0: 0.42, 2: 0.47}, ci={"ci_test": True})
    report.findings = []
    report.finish("completed")
    lines = summary(report, wall=40.0)
    assert lines[0] == "run t completed: 3/3 rollouts in 40.0 s"
    assert "  wall time   40.0 s (rollouts 6.0 s, 2.0 s each; start-up and shut-down 34.0 s)" in lines
    assert "  best eval   eval/tiny-arith 0.470 at rollout 3 (first 0.400, last 0.470)" in lines
    assert "  curve       eval/tiny-arith ▁▃█" in lines and "  doctor      no findings" in lines
    assert (
        lines[-1] == f"  run dir     {report.cfg.resolved_run_dir} (metrics.jsonl, plots/curves.png, logs/)"
    )

    failed = report_of(tmp_path, 1, 3, {})
    failed.findings = [
        Finding(
            "error", "the KL is not 0 at a first step", "ppo_kl = 0.1", "rollflow replay ...", "first-step-kl"
        )
    ]
    failed.finish(
        "failed", "CheckFailed: [KL checker] train/ppo_kl = 0.1 violates |x| < 1e-9 (rollout 1, stage check)"
    )
    lines = summary(failed, wall=12.0)
    assert lines[0] == "run t FAILED: 1/3 rollouts in 12.0 s"
    assert "  doctor      1. ERROR [first-step-kl] the KL is not 0 at a first step" in lines
    assert (
        "  cause       CheckFailed: [KL checker] train/ppo_kl = 0.1 violates |x| < 1e-9 (rollout 1, stage check)"
        in lines
    )


def test_plain_console_prints_lines_notices_and_the_summary(tmp_path):
    out, clock = io.StringIO(), Clock()
    report = report_of(tmp_path, 0, 2, {}, clock)
    with open_console(out, verbose=False) as console:
        assert type(console) is Console
        console.started(report)
        notify.notice("resuming run abc in runs/t at rollout 0")
        for rid in range(2):
            report.records.extend(records_of(rid, 0.5, 0.6 if rid == 1 else None))
            report.rollout_done(rid, 1.5)
            console.rollout_done(report, rid)
        notify.notice(
            "generate 1: no answer within 600 s; replaced engines [0]; the stage will be retried",
            logging.WARNING,
        )
        report.finish("completed")
        console.finished(report)
    notify.notice("after the console closed")  # no longer shown: the console unsubscribed
    lines = out.getvalue().splitlines()
    assert lines[0] == "resuming run abc in runs/t at rollout 0"
    assert lines[1].startswith("rollout 1/2  reward 0.500") and lines[2].endswith("eval@2 0.600")
    assert (
        lines[3]
        == "warning: generate 1: no answer within 600 s; replaced engines [0]; the stage will be retried"
    )
    assert (
        lines[4].startswith("run t completed: 2/2 rollouts in ")
        and "after the console closed" not in out.getvalue()
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_console_shows_a_bar_and_the_same_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    out, clock = _Terminal(), Clock()
    report = report_of(tmp_path, 0, 3, {}, clock)
    with open_console(out, verbose=False) as console:
        assert isinstance(console, ProgressConsole)
        console.started(report)
        for rid in range(3):
            report.records.extend(records_of(rid, 0.5))
            report.rollout_done(rid, 1.0)
            console.rollout_done(report, rid)
        assert (
            console.progress.tasks[0].completed == 3
            and "reward 0.500" in console.progress.tasks[0].fields["status"]
        )
        report.finish("completed")
        console.finished(report)
    text = out.getvalue()
    assert "rollout 3/3  reward 0.500" in text and "run t completed: 3/3 rollouts" in text
    assert console.progress is None  # the bar stopped before the summary


def test_verbose_console_adds_only_the_summary(tmp_path):
    out = io.StringIO()
    report = report_of(tmp_path, 1, 1, {})
    with open_console(out, verbose=True) as console:
        assert isinstance(console, VerboseConsole)
        console.rollout_done(report, 0)
        notify.notice("shown by Prefect's own console handler instead")
        report.finish("completed")
        console.finished(report)
    assert out.getvalue().startswith("run t completed: 1/1 rollouts in ")
    assert "rollout 1/1" not in out.getvalue() and "Prefect's own" not in out.getvalue()


def test_quiet_filter_keeps_warnings_of_libraries_only():
    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "x", None, None)

    quiet = _QuietFilter()
    assert not quiet.filter(
        record("prefect.task_runs", logging.ERROR)
    )  # a failed task's traceback: in run.log
    assert not quiet.filter(record("prefect.flow_runs", logging.INFO))  # "Finished in state Completed()"
    assert not quiet.filter(record("prefect", logging.INFO))  # "Starting temporary server ..."
    assert quiet.filter(record("prefect.client", logging.WARNING)) and quiet.filter(
        record("ray", logging.ERROR)
    )


def test_quiet_console_filters_prefects_console_handler_while_open():
    from prefect.logging.handlers import PrefectConsoleHandler

    handler = PrefectConsoleHandler(stream=io.StringIO())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with open_console(io.StringIO(), verbose=False):
            assert any(isinstance(f, _QuietFilter) for f in handler.filters)
        assert not handler.filters
        with open_console(io.StringIO(), verbose=True):
            assert not handler.filters
    finally:
        root.removeHandler(handler)
