"""The curves of one or more runs in one figure, read from their metrics.jsonl: reward, eval accuracy, KL,
entropy, grad norm and response length. The runs are overlaid, one colour each, so a bugged run can be laid
over a clean one.

`render_png` / `render_svg` give the figure as bytes / text of a requested pixel size (the Prefect UI embeds
them as data URIs); `write_plot` writes .png, .svg or a self-contained .html page. matplotlib is imported
only when a figure is drawn, with its Agg canvas and no pyplot state, so this is safe in any thread.
"""

from __future__ import annotations

import html
import io
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifacts.atomic import atomic_write_bytes, atomic_write_text
from artifacts.store import RunPaths, read_metrics

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

DEFAULT_SIZE = (1200, 800)  # pixels
_DPI = 100
FORMATS = (".png", ".svg", ".html")


@dataclass(frozen=True)
class Panel:
    """One axes of the figure: the metrics of one record kind, drawn against that kind's step."""

    title: str
    kind: str  # "rollout", "eval" or "step" (train steps)
    wanted: Callable[[str], bool]
    xlabel: str


def _named(*names: str) -> Callable[[str], bool]:
    return lambda metric: metric in names


def _eval_accuracy(metric: str) -> bool:
    return metric.startswith("eval/") and metric != "eval/step" and not metric.endswith("-truncated_ratio")


PANELS = (
    Panel("reward", "rollout", _named("rollout/raw_reward"), "rollout"),
    Panel("eval accuracy", "eval", _eval_accuracy, "rollout (weights evaluated)"),
    Panel("KL", "step", _named("train/ppo_kl", "train/kl_loss"), "train step"),
    Panel("entropy", "rollout", _named("rollout/entropy"), "rollout"),
    Panel("grad norm", "step", _named("train/grad_norm"), "train step"),
    Panel("response length", "rollout", _named("rollout/response_lengths"), "rollout"),
)

# {panel title: {metric: [(x, y), ...] sorted by x}}
Curves = dict[str, dict[str, list[tuple[int, float]]]]


def curves(records: Sequence[dict[str, Any]]) -> Curves:
    """Every panel's series out of metrics.jsonl records. x is the train step for train records, else the
    rollout (eval) id; when a record was logged twice for the same x (a retried stage) the last one counts."""
    points: dict[str, dict[str, dict[int, float]]] = {p.title: {} for p in PANELS}
    for record in records:
        for panel in PANELS:
            if record.get("kind") != panel.kind:
                continue
            x = record.get("step") if panel.kind == "step" else record.get("rollout_id")
            if not isinstance(x, int):
                continue
            metrics = record.get("metrics")
            if not isinstance(metrics, dict):  # a damaged record: no curve to draw from it
                continue
            for metric, value in metrics.items():
                # an int past a float's range (a damaged record) has no point; NaN and inf do, as gaps
                if panel.wanted(metric) and (
                    isinstance(value, float) or (isinstance(value, int) and abs(value) <= sys.float_info.max)
                ):
                    points[panel.title].setdefault(metric, {})[x] = float(value)
    return {
        title: {m: sorted(xy.items()) for m, xy in sorted(series.items())} for title, series in points.items()
    }


def load_curves(run_dir: str | Path) -> Curves:
    """`curves` of a run directory; FileNotFoundError naming the dir when it holds no metrics.jsonl."""
    path = RunPaths(run_dir).metrics
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no metrics.jsonl (not a run directory, or the run logged nothing yet)"
        )
    return curves(read_metrics(path))


def _figure(runs: Sequence[tuple[str, Curves]], size: tuple[int, int]) -> Any:
    """The matplotlib Figure: a 2 x 3 grid of PANELS, one colour per run, one line style per metric."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    width, height = size
    if width < 600 or height < 400:
        raise ValueError(f"plot size {width}x{height} px is too small for six panels (at least 600x400)")
    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    # fixed margins in pixels: matplotlib's constrained layout measured every tick label and took about as
    # long as drawing the whole figure
    left, right, bottom, top, gap_w, gap_h = 70, 15, 45, 60, 80, 75
    axes_w, axes_h = (width - left - right - 2 * gap_w) / 3, (height - bottom - top - gap_h) / 2
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap_w / axes_w,
        hspace=gap_h / axes_h,
    )
    colors = [f"C{i % 10}" for i in range(len(runs))]
    styles: list[LineStyleType] = ["-", "--", ":", "-."]
    for ax, panel in zip(fig.subplots(2, 3).flat, PANELS, strict=True):
        ax.set_title(panel.title, fontsize="medium")
        ax.set_xlabel(panel.xlabel, fontsize="small")
        ax.tick_params(labelsize="small")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rollouts and steps are whole numbers
        metrics = sorted({m for _, c in runs for m in c[panel.title]})
        style = {m: styles[i % len(styles)] for i, m in enumerate(metrics)}
        for (_, c), color in zip(runs, colors, strict=True):
            for metric, xy in c[panel.title].items():
                xs, ys = zip(*xy, strict=True)
                ax.plot(xs, ys, style[metric], color=color, marker="." if len(xy) < 30 else None)
        xs_all = [x for _, c in runs for xy in c[panel.title].values() for x, _ in xy]
        if xs_all and max(xs_all) == min(
            xs_all
        ):  # one point: autoscale would span +-0.05, with no whole number
            ax.set_xlim(min(xs_all) - 1, max(xs_all) + 1)
        if not metrics:  # e.g. no eval, or a rollout-only run has no train curves
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")
        elif len(metrics) > 1:  # which line style is which metric (colours are runs)
            ax.legend([_line("gray", style[m]) for m in metrics], metrics, fontsize="x-small")
        else:
            ax.set_ylabel(metrics[0], fontsize="small")
    fig.legend(
        [_line(color, "-") for color in colors],
        [label for label, _ in runs],
        loc="upper center",
        ncols=min(len(runs), 4),
        fontsize="small",
    )
    return fig


def _line(color: str, style: LineStyleType) -> Any:
    """A legend handle."""
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, linestyle=style, linewidth=2)


def _runs(run_dirs: Sequence[str | Path], labels: Sequence[str] | None) -> list[tuple[str, Curves]]:
    if not run_dirs:
        raise ValueError("no run directory to plot")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} run directories")
    names = list(labels) if labels is not None else [str(d) for d in run_dirs]
    return [(name, load_curves(d)) for name, d in zip(names, run_dirs, strict=True)]


def _render(
    run_dirs: Sequence[str | Path], fmt: str, size: tuple[int, int], labels: Sequence[str] | None
) -> bytes:
    from matplotlib import rc_context

    fig = _figure(_runs(run_dirs, labels), size)
    buf = io.BytesIO()
    # svg.fonttype "none": SVG text stays text (searchable, small), drawn with the viewer's fonts
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "rollflow"}):
        fig.savefig(buf, format=fmt, dpi=_DPI, metadata={"Date": None} if fmt == "svg" else None)
    return buf.getvalue()


def render_png(
    run_dirs: Sequence[str | Path], size: tuple[int, int] = DEFAULT_SIZE, labels: Sequence[str] | None = None
) -> bytes:
    """PNG bytes of the runs' curves, exactly `size` = (width, height) pixels; each run is named in the legend
    by its `labels` entry (default: the run dir as given). FileNotFoundError for a dir without metrics.jsonl."""
    return _render(run_dirs, "png", size, labels)


def render_svg(
    run_dirs: Sequence[str | Path], size: tuple[int, int] = DEFAULT_SIZE, labels: Sequence[str] | None = None
) -> str:
    """SVG text of the same figure as `render_png` (text kept as <text>, so labels are searchable), displayed at
    `size` CSS pixels."""
    svg = _render(run_dirs, "svg", size, labels).decode("utf-8")
    # matplotlib sizes SVGs in points (72 per inch), which browsers show a third larger than the PNG
    return re.sub(
        r'<svg([^>]*?) width="[\d.]+pt" height="[\d.]+pt"',
        rf'<svg\1 width="{size[0]}" height="{size[1]}"',
        svg,
        count=1,
    )


def render_html(
    run_dirs: Sequence[str | Path], size: tuple[int, int] = DEFAULT_SIZE, labels: Sequence[str] | None = None
) -> str:
    """A self-contained HTML page (no external files or scripts) embedding `render_svg`'s figure."""
    names = list(labels) if labels is not None else [str(d) for d in run_dirs]
    svg = render_svg(run_dirs, size, labels)
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE, which are not valid inside HTML
    title = "rollflow curves: " + ", ".join(names)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'</head>\n<body style="margin:1em;font-family:sans-serif">\n<h1 style="font-size:1.2em">'
        f"{html.escape(title)}</h1>\n{svg}\n</body></html>\n"
    )


def write_plot(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    size: tuple[int, int] = DEFAULT_SIZE,
    labels: Sequence[str] | None = None,
) -> Path:
    """Write the runs' curves to `out`, the format chosen by its extension (.png, .svg, .html), atomically;
    returns the path. ValueError for another extension."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix == ".png":
        atomic_write_bytes(out, render_png(run_dirs, size, labels))
    elif suffix == ".svg":
        atomic_write_text(out, render_svg(run_dirs, size, labels))
    elif suffix == ".html":
        atomic_write_text(out, render_html(run_dirs, size, labels))
    else:
        raise ValueError(f"{out}: unknown plot format {out.suffix!r}; use one of {', '.join(FORMATS)}")
    return out
