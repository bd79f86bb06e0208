"""The run's page in the Prefect UI: three artifacts on the parent flow run `run/<name>`, kept up to date as the
run goes, beside the per-rollout metrics tables on the `rollout-<id>` flow runs.

- `<name>-progress`: a progress artifact (0-100), updated after every rollout; its description says where the
  run is (rollout i/N, last reward, last eval).
- `<name>-summary`: a markdown artifact: status, the eval table and best eval, the last rollout's numbers, the
  checks passed / failed, the doctor's findings (end of a --ci-test run), the root cause of a failure, a config
  digest and the run dir's files (http links to the file server of `rollflow server`, flows/files.py, found once at
  the start of the run; absolute paths where none serves them). Updated after every rollout.
- `<name>-curves`: a markdown artifact embedding the curves (reward, eval accuracy, KL, entropy, grad norm,
  response length; `artifacts/plots.py`) as a PNG data URI, which the UI renders (raw `<svg>` it strips).
  Re-drawn after every rollout that ran an eval, and at the end.

Cost: each artifact is created once and then changed in place (PATCH /artifacts/{id}: the key keeps one
version per run instead of one per rollout). The run loop's publisher (`flows.runtime.Publisher`) calls
`rollout_done` in the background, off the loop's path. Progress and summary (two small requests) are sent at
most every `PAGE_EVERY` seconds. The chart, large and costly to draw, is sent after an eval at most every
`CURVES_EVERY` seconds. `close` sends all three at the end of the run, whatever its outcome.
`ROLLFLOW_RUN_PAGE=off` turns the three artifacts off (e.g. to measure their cost with bench/overhead.py).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.store import RunPaths
from config import RunConfig
from flows.console import duration, evals_text, number, pick, sparkline
from flows.files import VARIABLE, answers, parse_announcement, served_path
from flows.report import RunReport
from tasks import notify
from tasks.stages import artifact_slug

CHART_SIZE = (1200, 800)  # pixels of the embedded PNG (the size `rollflow plot` draws by default)
MAX_EVAL_ROWS = 50
PAGE_EVERY = 2.0  # seconds between two updates of progress and summary while the run goes
CURVES_EVERY = 60.0  # seconds between two drawings of the curves while the run goes (after an eval)
_STATUS = {
    "running": "running",
    "completed": "completed",
    "stopped": "stopped (--debug-exit-after-rollout)",
    "cancelled": "cancelled",
    "failed": "FAILED",
}


def enabled() -> bool:
    """Whether runs publish the run page (`ROLLFLOW_RUN_PAGE=off` turns it off)."""
    return os.environ.get("ROLLFLOW_RUN_PAGE", "on").lower() not in ("off", "0", "false", "no")


# -- markdown ---------------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    cells = [[c.replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in cells),
    ]


def _status_rows(report: RunReport) -> list[list[str]]:
    eta = report.eta() if report.status == "running" else None
    stats = report.rollout(report.done - 1) if report.seconds else None
    rows = [
        [
            "progress",
            f"rollout {report.done} of {report.total} ({100 * report.done / report.total:.0f} %), "
            f"elapsed {duration(report.elapsed)}" + (f", ETA {duration(eta)}" if eta is not None else ""),
        ]
    ]
    if stats is not None:
        rows.append(
            [
                f"rollout {stats.rollout_id}",
                f"reward {number(stats.reward)} · KL {number(stats.kl, 'sci')} · "
                f"entropy {number(stats.entropy)} · grad norm {number(stats.grad_norm, 'sig')} · response length "
                f"{number(stats.length, 'sig')} · {duration(stats.seconds)}",
            ]
        )
    rows += [["run dir", f"`{report.cfg.resolved_run_dir}`"], ["run id", f"`{report.run_id}`"]]
    return rows


def _eval_section(report: RunReport) -> list[str]:
    evals, names = report.evals(), report.eval_names()
    if not evals:
        every = report.cfg.eval.eval_interval
        return [
            "## Eval",
            "",
            f"No eval yet (every {every} rollouts)." if every else "Eval is off (--eval-interval).",
        ]
    rows = [evals[i] for i in pick(len(evals), {0, len(evals) - 1}, MAX_EVAL_ROWS)]
    out = [
        "## Eval",
        "",
        *_table(
            ["weights (rollout)", *names],
            [[str(v), *(number(values.get(n)) for n in names)] for v, values in rows],
        ),
    ]
    if len(rows) < len(evals):
        out += ["", f"{len(rows)} of {len(evals)} evals shown; every one is in metrics.jsonl."]
    out.append("")
    for name in names:
        best = report.best_eval(name)
        values = [v.get(name, float("nan")) for _, v in evals]
        if best is not None:
            out.append(
                f"- **best {name}: {number(best[1])}** at rollout {best[0]} (first {number(values[0])}, last "
                f"{number(values[-1])}) `{sparkline(values)}`"
            )
    return out


def _checks_section(report: RunReport) -> list[str]:
    checks = report.checks()
    if not checks:
        return []
    rows = [[c.name, str(c.passed), ", ".join(map(str, c.failed_at)) or "-"] for c in checks]
    return ["## Checks", "", *_table(["check", "passed", "failed at rollout"], rows)]


def _doctor_section(report: RunReport) -> list[str]:
    if report.doctor_error:
        return ["## Doctor", "", f"The doctor could not read the run: {report.doctor_error}"]
    if report.findings is None:
        return []
    out = [
        "## Doctor",
        "",
        f"`rollflow doctor {report.cfg.resolved_run_dir}` at the end of the run (--ci-test):",
        "",
    ]
    if not report.findings:
        return [*out, "No findings."]
    for i, f in enumerate(report.findings, start=1):
        out += [
            f"{i}. **{f.severity.upper()}** [{f.rule}] {f.title}",
            f"   - evidence: {f.evidence}",
            f"   - confirm: `{f.knife}`",
        ]
    return out


def non_default_flags(cfg: RunConfig) -> list[str]:
    """The flags that set `cfg` away from the defaults (the resolved config: a recipe's paths included), as a
    command line would give them."""
    from config import SECTIONS
    from flows.cli import flag

    default = RunConfig().model_dump()
    given = cfg.model_dump()
    out: list[str] = []
    for key, value in given.items():
        if key in SECTIONS:
            out += [_flag_text(flag(k), v) for k, v in value.items() if v != default[key][k]]
        elif value != default[key]:
            out.append(_flag_text(flag(key), value))
    return out


def _flag_text(name: str, value: Any) -> str:
    if value is True:
        return name
    if isinstance(value, list):
        return f"{name} {' '.join(map(str, value))}"
    if isinstance(value, dict):
        import json

        return f"{name} '{json.dumps(value)}'"
    return f"{name} {'none' if value is None else value}"


def config_rows(cfg: RunConfig) -> list[list[str]]:
    """The config digest: shape, model, algorithm, optimizer, backends, eval, checks, config hash."""
    r, t, e = cfg.rollout, cfg.train, cfg.eval
    kl = f"{t.kl_loss_type} x {t.kl_loss_coef}" if t.use_kl_loss else "off"
    evals = ", ".join(cfg.data.eval_prompt_data[::2]) if cfg.data.eval_prompt_data else "-"
    return [
        [
            "rollouts",
            f"{r.num_rollout} x {r.rollout_batch_size} prompts x {r.n_samples_per_prompt} samples, up to "
            f"{r.rollout_max_response_len} new tokens, temperature {r.rollout_temperature:g}",
        ],
        ["model", f"`{cfg.hf_checkpoint}` (recipe {cfg.recipe})"],
        ["algorithm", f"{t.advantage_estimator}, {t.policy_loss} (eps {t.eps_clip:g}), KL loss {kl}"],
        [
            "optimizer",
            f"lr {t.lr:g} {t.lr_decay_style}, global batch {cfg.global_batch_size} "
            f"({cfg.steps_per_rollout} steps per rollout), clip grad {t.clip_grad:g}",
        ],
        [
            "backends",
            f"{t.train_backend} trainer (DP {t.data_parallel_size} x TP {t.tensor_model_parallel_size}), "
            f"{r.rollout_backend} engine x {r.rollout_num_engines}",
        ],
        [
            "eval",
            f"every {e.eval_interval} rollouts: {evals} x {e.n_samples_per_eval_prompt} samples"
            if e.eval_interval
            else "off",
        ],
        ["--ci-test", "on" if cfg.ci.ci_test else "off"],
        ["config hash", f"`{cfg.config_hash()[:16]}`"],
    ]


@dataclass(frozen=True)
class FileLinks:
    """Where the file server of `rollflow server` answers (`url`, no trailing slash) and the directory it serves
    (`root`, resolved): the Files section links the files under it (flows/files.py)."""

    url: str
    root: Path


async def find_file_server() -> FileLinks | None:
    """The file server `rollflow server` recorded in the Prefect Variable `flows.files.VARIABLE`, when there is one
    and it answers; None otherwise: the ephemeral server of a plain `rollflow run`, a plain `prefect server start`,
    a `rollflow server` stopped since it set the Variable (it stays in the database). A Variable that cannot be
    read, or holds something else, is said as a warning: the run goes on with paths instead of links."""
    from prefect.variables import Variable

    try:
        value = await Variable.aget(VARIABLE)
        if value is None:
            return None
        url, root = parse_announcement(value)
    except Exception as e:
        notify.notice(
            f"the run page shows file paths, not links: the Prefect Variable {VARIABLE!r}: "
            f"{type(e).__name__}: {e}",
            logging.WARNING,
        )
        return None
    return FileLinks(url, root.resolve()) if await asyncio.to_thread(answers, url + "/") else None


def file_cell(name: str, path: Path, files: FileLinks | None) -> str:
    """A file's cell in the Files table: a link to the file server when it serves `path`. Else the absolute
    path as code, since a file:// link does not open from the UI's http page."""
    served = served_path(files.root, path) if files is not None else None
    if files is None or served is None:
        return f"`{path.absolute()}`"
    return f"[{name}]({files.url}/{served}{'/' if served and path.is_dir() else ''})"


def _files_section(cfg: RunConfig, files: FileLinks | None) -> list[str]:
    d = cfg.resolved_run_dir
    wanted = [
        ("config.yaml", "the resolved config"),
        ("metrics.jsonl", "every metric record"),
        ("plots/curves.png", "the curves (drawn at the end)"),
        ("rollouts", "one Parquet file per rollout"),
        ("logs/run.log", "Prefect's log lines of the run"),
        ("logs/actors.log", "what the actors printed"),
        ("faults.jsonl", "fault hook transitions"),
    ]
    rows = [
        [file_cell(name, d / name, files), what]
        for name, what in wanted
        if (d / name).exists() or name in ("plots/curves.png", "metrics.jsonl")
    ]
    if cfg.checkpoint.save:
        rows.append([file_cell("checkpoints", Path(cfg.checkpoint.save), files), "--save"])
    return ["## Files", "", f"In `{d}`:", "", *_table(["file", "holds"], rows)]


def summary_markdown(report: RunReport, files: FileLinks | None = None) -> str:
    """The summary artifact's markdown (see the module docstring); its files link to `files` when it serves
    them."""
    cfg = report.cfg
    lines = [f"# run/{cfg.name}: {_STATUS[report.status]}", "", *_table(["", ""], _status_rows(report)), ""]
    if report.failure:
        heading = "Stopped" if report.status == "cancelled" else "Failure"
        lines += [f"## {heading}", "", f"`{report.failure}`", ""]
    lines += [*_eval_section(report), ""]
    for section in (_checks_section(report), _doctor_section(report)):
        if section:
            lines += [*section, ""]
    flags = non_default_flags(cfg)
    lines += [
        "## Config",
        "",
        *_table(["", ""], config_rows(cfg)),
        "",
        "Set away from the defaults: " + (f"`{' '.join(flags)}`" if flags else "nothing"),
        "",
    ]
    return "\n".join([*lines, *_files_section(cfg, files)]) + "\n"


def curves_markdown(cfg: RunConfig, png: bytes, after: int) -> str:
    """The curves artifact's markdown: the figure as a PNG data URI."""
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return (
        f"# Curves of run/{cfg.name} after {after} rollout{'s' if after != 1 else ''}\n\n"
        f"![reward, eval accuracy, KL, entropy, grad norm and response length]({uri})\n\n"
        f"Reward, entropy and response length per rollout, KL and grad norm per optimizer step, eval accuracy per "
        f"weights version. Also in `{cfg.resolved_run_dir / 'plots' / 'curves.png'}` (drawn at the end); "
        f"overlay runs with `rollflow plot RUN_DIR ...`.\n"
    )


def progress_text(report: RunReport) -> str:
    """The progress artifact's description."""
    text = f"run/{report.cfg.name}: rollout {report.done}/{report.total} ({_STATUS[report.status]})"
    if report.seconds:
        text += f", reward {number(report.rollout(report.done - 1).reward)}"
    last = report.last_eval()
    return text + (f", {evals_text([last])}" if last else "")


# -- the artifacts ----------------------------------------------------------------------------------
class RunPage:
    """The three artifacts of one run's parent flow run (see the module docstring). `seconds` accumulates the
    wall time spent on them, for the run's record of its own overhead."""

    def __init__(self, report: RunReport, flow_run_id: uuid.UUID) -> None:
        self.report, self.flow_run_id = report, flow_run_id
        self.slug = artifact_slug(report.cfg.name)
        self.ids: dict[str, uuid.UUID] = {}
        self.files: FileLinks | None = None  # found by `open`
        self.seconds = 0.0
        self._sent = self._drawn = time.monotonic()  # when progress and summary / the curves were last sent
        self._undrawn = False  # an eval ran since the curves were last drawn

    async def open(self) -> None:
        """Find the file server the summary links to, and create the progress and summary artifacts (the curves
        come with the first eval)."""
        from prefect.artifacts import MarkdownArtifact, ProgressArtifact

        began = time.perf_counter()
        self.files = await find_file_server()
        name = self.report.cfg.name
        progress = ProgressArtifact(
            key=f"{self.slug}-progress",
            description=progress_text(self.report),
            progress=self._percent(),
            flow_run_id=self.flow_run_id,
        )
        self.ids["progress"] = (await progress.acreate()).id
        summary = MarkdownArtifact(
            key=f"{self.slug}-summary",
            description=f"summary of run {name}",
            markdown=summary_markdown(self.report, self.files),
            flow_run_id=self.flow_run_id,
        )
        self.ids["summary"] = (await summary.acreate()).id
        self._sent = self._drawn = time.monotonic()
        self.seconds += time.perf_counter() - began

    async def rollout_done(self, rollout_id: int) -> None:
        """After each rollout: progress and summary, if `PAGE_EVERY` seconds have passed since they were last
        sent. The curves too, when an eval ran since they were last drawn and `CURVES_EVERY` seconds have
        passed."""
        self._undrawn |= self.report.evaluated_in(rollout_id)
        now = time.monotonic()
        curves = self._undrawn and now - self._drawn >= CURVES_EVERY
        if not curves and now - self._sent < PAGE_EVERY:
            return
        began = time.perf_counter()
        await self._update(curves=curves)
        self.seconds += time.perf_counter() - began

    async def close(self) -> None:
        """At the end of the run (any outcome): progress, summary and the final curves."""
        began = time.perf_counter()
        await self._update(curves=True)
        self.seconds += time.perf_counter() - began

    def _percent(self) -> float:
        return 100.0 * self.report.done / self.report.total

    async def _update(self, curves: bool) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        async with get_client() as client:
            await client.update_artifact(
                self.ids["progress"],
                ArtifactUpdate(data=self._percent(), description=progress_text(self.report)),
            )
            await client.update_artifact(
                self.ids["summary"], ArtifactUpdate(data=summary_markdown(self.report, self.files))
            )
            self._sent = time.monotonic()
            if curves:
                await self._curves(client)
                self._drawn, self._undrawn = time.monotonic(), False

    async def _curves(self, client: Any) -> None:
        """Draw the curves (in a worker thread: matplotlib's Agg canvas, no pyplot state) and post them."""
        from prefect.artifacts import MarkdownArtifact
        from prefect.client.schemas.actions import ArtifactUpdate

        from artifacts.plots import render_png

        cfg = self.report.cfg
        if not RunPaths(
            cfg.resolved_run_dir
        ).metrics.is_file():  # stopped or failed before it logged anything
            return
        png = await asyncio.to_thread(render_png, [cfg.resolved_run_dir], CHART_SIZE, [cfg.name])
        markdown = curves_markdown(cfg, png, self.report.done)
        if "curves" in self.ids:
            await client.update_artifact(self.ids["curves"], ArtifactUpdate(data=markdown))
            return
        created = await MarkdownArtifact(
            key=f"{self.slug}-curves",
            markdown=markdown,
            flow_run_id=self.flow_run_id,
            description=f"curves of run {cfg.name}",
        ).acreate(client)
        self.ids["curves"] = created.id
