"""The console of `rollflow run`: a presentation layer over the run's records, metrics.jsonl untouched.

Quiet (the default): a header, one concise line per rollout, notices (resuming, a retried stage), a progress
bar under the lines when stdout is a terminal, and a summary table at the end. A long run prints every k-th
rollout and every rollout that evaluated: at most about `MAX_ROLLOUT_LINES`. Prefect's run logs (task states,
the `rollout N: {...}` records) go to the Prefect UI and `<run dir>/logs/run.log`, not the console. The actors'
output goes to `<run dir>/logs/actors.log`. `--verbose`: the full console (Prefect's log lines, the actors'
output) plus the summary table.

Everything here writes to the stream it was given, never through `print`: inside a flow run Prefect may have
replaced `print` with its logger (log_prints).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from config import RunConfig
from flows.report import RolloutStats, RunReport, observe
from tasks import notify
from tasks.memory import peaks

MAX_ROLLOUT_LINES = 40  # a long run prints every k-th rollout so that the console stays short
MAX_EVAL_ROWS = 12  # rows of the summary's eval table (first, last and best always among them)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # Prefect's loggers of flow and task runs
_SPARKS = "▁▂▃▄▅▆▇█"
_LABEL = 12  # width of the summary table's first column


# -- numbers ----------------------------------------------------------------------------------------
def duration(seconds: float | None) -> str:
    """`12.3 s`, `3m05s`, `2h04m`; `-` for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def number(value: float | None, style: str = "fixed") -> str:
    """A metric for a console cell: 3 decimals (`fixed`), 3 significant digits (`sig`) or `1.2e-03` (`sci`,
    exact 0 as `0`); `-` for a missing value."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if style == "sci":
        return "0" if value == 0 else f"{value:.1e}"
    return f"{value:.3g}" if style == "sig" else f"{value:.3f}"


def sparkline(values: Sequence[float]) -> str:
    """One block character per value, scaled from the lowest to the highest (all alike: the middle block)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    return "".join(
        " "
        if not math.isfinite(v)
        else _SPARKS[3]
        if span == 0
        else _SPARKS[min(len(_SPARKS) - 1, int((v - low) / span * len(_SPARKS)))]
        for v in values
    )


def evals_text(evals: list[tuple[int, dict[str, float]]]) -> str:
    """`eval@10 0.535` per eval (`eval@10 gsm8k 0.512 math 0.301` with several datasets)."""
    parts = []
    for version, values in evals:
        if len(values) == 1:
            parts.append(f"eval@{version} {number(next(iter(values.values())))}")
        else:
            parts.append(
                f"eval@{version} "
                + " ".join(f"{k.removeprefix('eval/')} {number(v)}" for k, v in values.items())
            )
    return "  ".join(parts)


# -- lines ------------------------------------------------------------------------------------------
def rollout_line(stats: RolloutStats, total: int, eta: float | None) -> str:
    """The one console line of a rollout: reward, KL, entropy, grad norm, response length, its wall time, the
    run's ETA, and the evals it ran."""
    width = len(str(total))
    line = (
        f"rollout {stats.rollout_id + 1:>{width}}/{total}  reward {number(stats.reward)}  "
        f"kl {number(stats.kl, 'sci')}  entropy {number(stats.entropy)}  grad {number(stats.grad_norm, 'sig')}  "
        f"len {number(stats.length, 'sig')}  {duration(stats.seconds)}"
    )
    if eta is not None:
        line += f"  ETA {duration(eta)}"
    return line + (f"  {evals_text(stats.evals)}" if stats.evals else "")


def prints_line(report: RunReport, rollout_id: int) -> bool:
    """Whether rollout `rollout_id` gets a console line: every rollout of a run of up to `MAX_ROLLOUT_LINES`,
    else every k-th, and always the last one and every one that ran an eval."""
    every = max(1, math.ceil((report.end - report.start) / MAX_ROLLOUT_LINES))
    return (
        (rollout_id - report.start) % every == 0
        or rollout_id + 1 == report.end
        or report.evaluated_in(rollout_id)
    )


def header(cfg: RunConfig, verbose: bool) -> str:
    """The first line of `rollflow run`: what runs, and where."""
    r = cfg.rollout
    every = f", eval every {cfg.eval.eval_interval}" if cfg.eval.eval_interval else ""
    hint = "" if verbose else " (--verbose: every log line)"
    # float32 is the default: only another precision is named
    precision = f", precision {cfg.train.precision}" if cfg.train.precision != "fp32" else ""
    return (
        f"rollflow run {cfg.name}: {r.num_rollout} rollouts x {r.rollout_batch_size} prompts x "
        f"{r.n_samples_per_prompt} samples{every}{precision} -> {cfg.resolved_run_dir}; starting Prefect, Ray and the "
        f"actors{hint}"
    )


def pick(n: int, keep: set[int], k: int) -> list[int]:
    """Up to `k` of the indices 0..n-1, sorted: all of `keep`, then evenly spread ones."""
    if n <= k:
        return list(range(n))
    chosen = set(sorted(keep)[:k])
    step = (n - 1) / (k - 1)
    for i in range(k):  # evenly spaced indices; one already chosen adds nothing
        if len(chosen) >= k:
            break
        chosen.add(round(i * step))
    return sorted(chosen)


def eval_table(report: RunReport) -> list[str]:
    """The eval table's rows, `weights  eval/NAME ...` (the version is the rollout whose weights were
    evaluated), at most `MAX_EVAL_ROWS` evals: first, last and each eval's best among them."""
    evals, names = report.evals(), report.eval_names()
    if not evals:
        return []
    best = {b[0] for name in names if (b := report.best_eval(name)) is not None}
    keep = {0, len(evals) - 1} | {i for i, (version, _) in enumerate(evals) if version in best}
    rows = [evals[i] for i in pick(len(evals), keep, MAX_EVAL_ROWS)]
    widths = [max(len(n), 6) for n in names]
    lines = ["weights  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))]
    for version, values in rows:
        lines.append(
            f"{version:>7}  "
            + "  ".join(f"{number(values.get(n)):>{w}}" for n, w in zip(names, widths, strict=True))
        )
    if len(rows) < len(evals):
        lines.append(f"({len(rows)} of {len(evals)} evals; all of them in metrics.jsonl)")
    return lines


def _checks_lines(report: RunReport) -> list[str]:
    parts = []
    for c in report.checks():
        total = c.passed + len(c.failed_at)
        name = c.name.removeprefix("check/")
        parts.append(
            f"{name} {c.passed}/{total}"
            + (f" (FAILED at rollout {', '.join(map(str, c.failed_at))})" if c.failed_at else "")
        )
    return parts


def _doctor_lines(report: RunReport) -> list[str]:
    if report.doctor_error:
        return [f"could not read the run: {report.doctor_error}"]
    if report.findings is None:
        return []
    if not report.findings:
        return ["no findings"]
    return [f"{i}. {f.severity.upper()} [{f.rule}] {f.title}" for i, f in enumerate(report.findings, start=1)]


def memory_line(records: list[dict[str, Any]]) -> str | None:
    """Each process's peak resident memory (tasks/memory.py), GiB: "driver 1.20, engine-0 3.10, ... (sum 9.40)";
    None when the run recorded none."""
    top = peaks(records)
    total = top.pop("total", None)
    if not top:
        return None
    each = ", ".join(f"{name} {value:.2f}" for name, value in top.items())
    return f"{each} GiB" + (f" (sum {total:.2f})" if total is not None else "")


def summary(report: RunReport, wall: float) -> list[str]:
    """The summary table printed when a run ends: outcome, eval table and curve, best eval, wall time, checks
    (when any ran), the doctor's findings (with --ci-test), the root cause of a failure, and the run dir."""
    status = {
        "completed": "completed",
        "stopped": "stopped (--debug-exit-after-rollout)",
        "cancelled": "cancelled",
        "failed": "FAILED",
        "running": "ended",
    }[report.status]
    rollout_time = sum(report.seconds.values())
    each = f", {duration(rollout_time / len(report.seconds))} each" if report.seconds else ""
    rows: list[tuple[str, list[str]]] = [
        (
            "rollouts",
            [
                f"{report.done}/{report.total}"
                + (f" (this process: {report.start}-{report.done - 1})" if report.start else "")
            ],
        ),
        (
            "wall time",
            [
                f"{duration(wall)} (rollouts {duration(rollout_time)}{each}; start-up and shut-down "
                f"{duration(max(wall - rollout_time, 0.0))})"
            ],
        ),
    ]
    table = eval_table(report)
    if table:
        rows.append(("eval", table))
        for name in report.eval_names():
            best = report.best_eval(name)
            values = [v.get(name, math.nan) for _, v in report.evals()]
            if best is not None:
                rows.append(
                    (
                        "best eval",
                        [
                            f"{name} {number(best[1])} at rollout {best[0]} (first "
                            f"{number(values[0])}, last {number(values[-1])})"
                        ],
                    )
                )
            rows.append(("curve", [f"{name} {sparkline(values)}"]))
    if report.checks():
        rows.append(("checks", _checks_lines(report)))
    if peak := memory_line(report.records):
        rows.append(("peak memory", [peak]))
    if report.findings is not None or report.doctor_error:
        rows.append(("doctor", _doctor_lines(report)))
    if report.failure:
        rows.append(("cause", [report.failure]))
    d = report.cfg.resolved_run_dir
    rows.append(("run dir", [f"{d} (metrics.jsonl, plots/curves.png, logs/)"]))
    out = [f"run {report.cfg.name} {status}: {report.done}/{report.total} rollouts in {duration(wall)}"]
    for label, lines in rows:
        out += [f"  {label if i == 0 else '':<{_LABEL}}{line}" for i, line in enumerate(lines)]
    return out


# -- presenters --------------------------------------------------------------------------------------
class Console:
    """The quiet console without a terminal: plain lines (see the module docstring). An observer of the run
    (`flows.report`) and a listener of its notices (`tasks.notify`)."""

    def __init__(self, stream: IO[str], clock: Callable[[], float], began: float | None = None) -> None:
        self.stream, self.clock = stream, clock
        self.t0 = began if began is not None else clock()

    def write(self, line: str) -> None:
        """One line on the console."""
        self.stream.write(line + "\n")
        self.stream.flush()

    def started(self, report: RunReport) -> None:
        """Nothing to show until the first rollout."""

    def rollout_done(self, report: RunReport, rollout_id: int) -> None:
        """The rollout's line, when `prints_line` picks it."""
        if prints_line(report, rollout_id):
            self.write(rollout_line(report.rollout(rollout_id), report.total, report.eta()))

    def finished(self, report: RunReport) -> None:
        """The summary table."""
        for line in summary(report, self.clock() - self.t0):
            self.write(line)

    def on_record(self, run_dir: Any, record: dict[str, Any]) -> None:
        """Records reach the console as rollout lines, not one by one."""

    def on_notice(self, text: str, level: int) -> None:
        """A notice is a console line of its own."""
        self.write(text if level < logging.WARNING else f"warning: {text}")


class VerboseConsole(Console):
    """`--verbose`: Prefect's log lines and the actors' output stay on the console as they are; only the summary
    table is added at the end."""

    def rollout_done(self, report: RunReport, rollout_id: int) -> None:
        """Prefect's log lines already show the rollout."""

    def on_notice(self, text: str, level: int) -> None:
        """Prefect's log lines already show the notice."""


class ProgressConsole(Console):
    """The quiet console on a terminal: the plain lines, with a progress bar under them (rollout i/N, elapsed,
    ETA, last reward, last eval) that advances after every rollout."""

    def __init__(self, stream: IO[str], clock: Callable[[], float], began: float | None = None) -> None:
        super().__init__(stream, clock, began)
        self.progress: Any = None
        self.task: Any = None

    def write(self, line: str) -> None:
        """A line above the bar while it shows (rich keeps the bar at the bottom)."""
        if self.progress is None:
            super().write(line)
        else:
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def started(self, report: RunReport) -> None:
        """Show the bar at the rollout the run starts from."""
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("rollout"),
            MofNCompleteColumn(),
            BarColumn(bar_width=30),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=RichConsole(file=self.stream),
            redirect_stdout=False,
            redirect_stderr=False,
            refresh_per_second=2,
        )
        self.task = self.progress.add_task(
            "run", total=report.total, completed=report.start, status="starting Ray and the actors"
        )
        self.progress.start()

    def rollout_done(self, report: RunReport, rollout_id: int) -> None:
        """Advance the bar, show the rollout's numbers on it, and print its line above it when picked."""
        super().rollout_done(report, rollout_id)
        if self.progress is not None:
            self.progress.update(self.task, completed=report.done, status=bar_status(report, rollout_id))

    def finished(self, report: RunReport) -> None:
        """Leave the bar where it stopped, then the summary table."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        super().finished(report)


def bar_status(report: RunReport, rollout_id: int) -> str:
    """The text right of the bar: ETA, the last rollout's reward and the last eval."""
    stats, last = report.rollout(rollout_id), report.last_eval()
    text = f"ETA {duration(report.eta())}  reward {number(stats.reward)}"
    return text + (f"  {evals_text([last])}" if last else "")


class _QuietFilter(logging.Filter):
    """On Prefect's console handler for a quiet run: keep warnings and errors of other loggers (Prefect's client,
    Ray, libraries), drop everything of the flow and task run loggers (their lines, tracebacks included, are in
    the UI and logs/run.log; the run's failure is the CLI's last line) and every INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING and not record.name.startswith(RUN_LOGGERS)


@contextlib.contextmanager
def open_console(stream: IO[str], verbose: bool, began: float | None = None) -> Iterator[Console]:
    """The console of one `rollflow run` in this process: registered as the run's observer and notice listener,
    and (unless `verbose`) Prefect's console handler quietened and the actors' output kept off the console.
    A progress bar only when `stream` is a terminal. `began` (time.monotonic()) is when the command started: the
    summary's wall time counts from there."""
    import time

    from prefect.logging.handlers import PrefectConsoleHandler

    from tasks import actors

    kind = (
        VerboseConsole
        if verbose
        else (ProgressConsole if stream.isatty() and os.environ.get("TERM") != "dumb" else Console)
    )
    console = kind(stream, time.monotonic, began)
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    quiet = _QuietFilter()
    if not verbose:
        for h in handlers:
            h.addFilter(quiet)
        actors.echo_actor_logs(False)
    stop_observing, unsubscribe = observe(console), notify.subscribe(console)
    try:
        yield console
    finally:
        stop_observing()
        unsubscribe()
        if isinstance(console, ProgressConsole) and console.progress is not None:
            console.progress.stop()  # the run ended before `finished` (e.g. failed while starting)
        for h in handlers:
            h.removeFilter(quiet)
        actors.echo_actor_logs(True)
