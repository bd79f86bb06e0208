"""`rollflow plot`: the curves of several runs overlaid in one figure, PNG of the requested size, SVG whose
text names every run and panel, a self-contained HTML page; missing metrics leave a labelled empty panel."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from artifacts.plots import PANELS, curves, render_html, render_png, render_svg, write_plot
from flows.cli import main


def _write_run(
    run_dir: Path, slope: float, *, rollouts: int = 20, train: bool = True, evals: bool = True
) -> Path:
    """A metrics.jsonl in the format `log_metrics` writes, with the metrics the plot draws."""
    lines = []
    for rid in range(rollouts):
        lines.append(
            {
                "kind": "rollout",
                "rollout_id": rid,
                "metrics": {
                    "rollout/raw_reward": 0.4 + slope * rid,
                    "rollout/response_lengths": 5.0 - 0.01 * rid,
                    "rollout/truncated_ratio": 0.0,
                },
            }
        )
        if train:
            lines.append(
                {"kind": "rollout", "rollout_id": rid, "metrics": {"rollout/entropy": 0.6 - 0.001 * rid}}
            )
            for s in range(2):
                step = 2 * rid + s
                lines.append(
                    {
                        "kind": "step",
                        "rollout_id": rid,
                        "step": step,
                        "metrics": {
                            "train/ppo_kl": 0.001 * s,
                            "train/kl_loss": 0.0,
                            "train/grad_norm": 1.0 + slope,
                            "train/step": step,
                        },
                    }
                )
        if evals and rid % 5 == 0:
            lines.append(
                {
                    "kind": "eval",
                    "rollout_id": rid,
                    "metrics": {
                        "eval/tiny-arith": 0.4 + slope * rid,
                        "eval/tiny-arith-truncated_ratio": 0.0,
                        "eval/step": rid,
                    },
                }
            )
        lines.append({"kind": "perf", "rollout_id": rid, "metrics": {"perf/step_time": 1.0}})
        lines.append({"kind": "check", "rollout_id": rid, "metrics": {"check/finite_metrics": 1.0}})
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


def test_curves_pick_each_panel_series_at_its_step():
    records = [
        {"kind": "rollout", "rollout_id": 1, "metrics": {"rollout/raw_reward": 0.1, "rollout/entropy": 0.5}},
        {"kind": "rollout", "rollout_id": 0, "metrics": {"rollout/raw_reward": 0.0}},
        {
            "kind": "rollout",
            "rollout_id": 1,
            "metrics": {"rollout/raw_reward": 0.2},
        },  # a retried stage: last wins
        {
            "kind": "step",
            "rollout_id": 0,
            "step": 7,
            "metrics": {"train/ppo_kl": 0.0, "train/kl_loss": 0.3, "train/grad_norm": 2.0, "train/step": 7},
        },
        {
            "kind": "eval",
            "rollout_id": 4,
            "metrics": {"eval/a": 0.5, "eval/a-truncated_ratio": 0.1, "eval/b": 0.7, "eval/step": 4},
        },
    ]
    c = curves(records)
    assert set(c) == {p.title for p in PANELS}
    assert c["reward"] == {"rollout/raw_reward": [(0, 0.0), (1, 0.2)]}
    assert c["KL"] == {"train/kl_loss": [(7, 0.3)], "train/ppo_kl": [(7, 0.0)]}  # x = the train step
    assert c["eval accuracy"] == {
        "eval/a": [(4, 0.5)],
        "eval/b": [(4, 0.7)],
    }  # no truncated ratio, no step key
    assert c["entropy"] == {"rollout/entropy": [(1, 0.5)]} and c["grad norm"] == {
        "train/grad_norm": [(7, 2.0)]
    }
    assert c["response length"] == {}


def test_two_runs_in_one_png_of_the_requested_size_and_one_svg(tmp_path):
    from PIL import Image

    clean = _write_run(tmp_path / "clean", 0.01)
    bugged = _write_run(tmp_path / "bugged", -0.01)
    png = render_png([clean, bugged], size=(900, 600))
    image = Image.open(io.BytesIO(png))
    image.load()
    assert image.format == "PNG" and image.size == (900, 600)

    svg = render_svg([clean, bugged], size=(900, 600))
    assert f">{clean}<" in svg and f">{bugged}<" in svg  # the legend names each run dir
    for panel in PANELS:
        assert f">{panel.title}<" in svg
    for metric in (
        "rollout/raw_reward",
        "eval/tiny-arith",
        "train/ppo_kl",
        "train/kl_loss",
        "rollout/entropy",
        "train/grad_norm",
        "rollout/response_lengths",
    ):
        assert f">{metric}<" in svg
    assert "truncated_ratio" not in svg and "no data" not in svg
    assert '<svg xmlns:xlink="http://www.w3.org/1999/xlink" width="900" height="600"' in svg


def test_one_curve_per_run(tmp_path):
    """Each run draws its own reward curve: a third run adds a line to the reward panel."""
    runs = [_write_run(tmp_path / f"r{i}", 0.01 * i) for i in range(3)]
    assert render_svg(runs[:2]).count('id="line2d_') < render_svg(runs).count('id="line2d_')


def test_runs_without_eval_or_training_leave_labelled_empty_panels(tmp_path):
    rollout_only = _write_run(tmp_path / "rollout-only", 0.01, train=False, evals=False)
    svg = render_svg([rollout_only], labels=["rec"])
    assert svg.count(">no data<") == 4  # eval accuracy, KL, entropy, grad norm
    assert ">rec<" in svg and ">rollout/raw_reward<" in svg


def test_html_page_is_self_contained(tmp_path):
    run = _write_run(tmp_path / "run", 0.01)
    page = render_html([run])
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1 and "<?xml" not in page
    assert "<script" not in page and 'href="http' not in page and "src=" not in page
    assert f"rollflow curves: {run}" in page


def test_write_plot_and_cli(tmp_path, capsys):
    a, b = _write_run(tmp_path / "a", 0.01), _write_run(tmp_path / "b", 0.02)
    for ext in ("png", "svg", "html"):
        out = tmp_path / f"out.{ext}"
        assert main(["plot", str(a), str(b), "-o", str(out), "--size", "800x500"]) == 0
        assert out.stat().st_size > 1000 and f"wrote {out}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown plot format '.jpg'"):
        write_plot([a], tmp_path / "out.jpg")
    assert main(["plot", str(a), str(tmp_path / "nothing"), "-o", str(tmp_path / "x.png")]) == 2
    assert "nothing: no metrics.jsonl" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
