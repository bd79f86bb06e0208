"""The generated docs pages are what docs/gen_reference.py writes from today's code; the metric table, the
results files and the runnable-block markers are read as documented."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tasks.metric_names import METRICS, metric_of
from tests.doc_blocks import pages_with_blocks, parse_blocks

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("page", list(GEN.PAGES))
def test_generated_page_is_up_to_date(page):
    committed = ROOT / "docs" / page
    assert committed.is_file(), f"docs/{page} is missing: run `{GEN.REGENERATE}`"
    assert committed.read_text() == GEN.PAGES[page](), (
        f"docs/{page} differs from what the code gives: run `{GEN.REGENERATE}` and commit the page"
    )


def test_readme_scaling_block_is_up_to_date():
    assert (ROOT / "README.md").read_text() == GEN.readme_text(), (
        f"README.md's scaling block differs from bench/results/8*-scaling*.md: run `{GEN.REGENERATE}`"
    )


def test_readme_scaling_block_keeps_named_columns_and_needs_its_markers(tmp_path, monkeypatch):
    result = tmp_path / "80-scaling.md"
    result.write_text(
        "---\ntitle: t\ncommand: python bench/scaling.py\nmeasured: 2026-01-02\nmachine: m\n---\n"
        "| "
        + " | ".join(("x", *GEN.README_COLUMNS))
        + " |\n|"
        + "---|" * (len(GEN.README_COLUMNS) + 1)
        + "\n"
        "| drop | " + " | ".join(f"v{i}" for i in range(len(GEN.README_COLUMNS))) + " |\n\n"
        "targets (0.5B x 256):\n- a: 1 -> met\n"
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"# r\n{GEN.README_BEGIN}\nold\n{GEN.README_END}\ntail\n")
    monkeypatch.setattr(GEN, "SCALING", (result,))
    monkeypatch.setattr(GEN, "README", readme)
    text = GEN.readme_text()
    assert "old" not in text and text.endswith(f"{GEN.README_END}\ntail\n")
    assert "| v0 | v1 |" in text and "drop" not in text and "- a: 1 -> met" in text
    readme.write_text("# r\nno markers\n")
    with pytest.raises(ValueError, match="lacks the scaling block's markers"):
        GEN.readme_text()
    result.write_text(result.read_text().replace("| TRL peak GiB", "| other"))
    readme.write_text(f"{GEN.README_BEGIN}\n{GEN.README_END}\n")
    with pytest.raises(ValueError, match="lacks column"):
        GEN.readme_text()


def test_metric_names_are_unique_and_patterns_match_their_instances():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert metric_of("eval/tiny-arith").name == "eval/<name>"
    assert metric_of("eval/tiny-arith-truncated_ratio").name in ("eval/<name>-truncated_ratio", "eval/<name>")
    assert metric_of("perf/mem_rss_gb/engine-0").name == "perf/mem_rss_gb/<process>"
    assert metric_of("rollout/zero_std/count_0.0").name == "rollout/zero_std/count_<reward>"
    assert metric_of("train/loss").name == "train/loss"
    assert (
        metric_of("train/cispo_clipfrac").plugin and metric_of("train/cispo_clipfrac", plugins=False) is None
    )
    assert metric_of("rollout/no_such_metric") is None
    assert metric_of("perf/mem_rss_gb/a/b") is None  # a part stands for one path segment


def test_results_files_need_their_header(tmp_path):
    bad = tmp_path / "x.md"
    bad.write_text("---\ntitle: t\ncommand: python bench/x.py\nmachine: m\n---\n| a |\n")
    with pytest.raises(ValueError, match="x.md: header lacks measured"):
        GEN.read_result(bad)
    bad.write_text("| a |\n")
    with pytest.raises(ValueError, match="x.md: expected a '---' header block"):
        GEN.read_result(bad)
    for path in sorted(GEN.RESULTS.glob("*.md")):
        if path.name != "README.md":
            header, body = GEN.read_result(path)
            assert body, path


SAMPLE = """# A page

<!-- runnable: expect="rollout \\d+" -->
```bash
rollflow run --dry-run
```

```bash
not runnable
```

<!-- runnable: expect="refused" exit=2 -->

```bash
rollflow run --lr inf
echo "said \\"no\\""
```
"""


def test_runnable_blocks_are_read_with_their_expectations():
    shown = '\nWrite `<!-- runnable: expect="x" -->` before a block, as in:\n\n```markdown\n<!-- runnable: exit=x -->\n```\n'
    first, second = parse_blocks(SAMPLE + shown, "how-to/x.md")
    assert (first.body, first.expect, first.exit, first.line) == (
        "rollflow run --dry-run",
        r"rollout \d+",
        0,
        5,
    )
    assert second.exit == 2 and second.expect == "refused" and second.first_line == "rollflow run --lr inf"
    assert second.body.splitlines()[1] == 'echo "said \\"no\\""'


@pytest.mark.parametrize(
    "marker, message",
    [
        ("<!-- runnable: exit=1 -->\n```bash\nx\n```", 'needs expect="<regex>"'),
        ('<!-- runnable: expect="(" -->\n```bash\nx\n```', "expect is not a regex"),
        ('<!-- runnable: expect="a" exit=one -->\n```bash\nx\n```', "exit must be a number"),
        ('<!-- runnable: expect="a" exp=1 -->\n```bash\nx\n```', "'exp' is unknown"),
        (
            '<!-- runnable: expect="a" -->\n\nsome text\n```bash\nx\n```',
            "must be followed by a ```bash block",
        ),
    ],
)
def test_a_malformed_marker_is_named_with_its_page_and_line(marker, message):
    with pytest.raises(ValueError, match=f"p.md:3: .*{re.escape(message)}"):
        parse_blocks("# t\n\n" + marker, "p.md")


def test_every_page_s_markers_are_well_formed():
    pages = pages_with_blocks()  # raises on a malformed marker, naming the page and line
    assert "reference/commands.md" in pages
