"""Every bad input and hostile file of tests/bad_inputs/ is refused before any work: one line naming the flag
or file, a non-zero exit, no traceback."""

from __future__ import annotations

import contextlib
import io

import pytest

from tests.bad_inputs import CASES, PAGE, Case, page_rows, render_page, table_row

TABLE = PAGE.read_text()


class WouldStartWork(AssertionError):
    """Raised where a command would start Ray, Prefect or a run: the case got past validation."""


def refuse(*_: object, **__: object) -> None:
    raise WouldStartWork("validation passed: the command would have started work")


def run_case(case: Case, tmp_path, monkeypatch) -> tuple[int, str]:
    import deployments.serve
    import flows.reaper
    from flows.cli import main

    monkeypatch.setattr(flows.reaper, "start_reaper", refuse)  # `run`: called right after validation
    monkeypatch.setattr(deployments.serve, "serve_run", refuse)
    monkeypatch.setattr("flows.cli._start_replay", refuse)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(case.argv(tmp_path))
        except SystemExit as e:  # argparse's own refusals
            code = int(e.code or 0)
    return code, err.getvalue() + out.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.kind}: {c.what}" for c in CASES])
def test_refused_before_work_with_one_line(case, tmp_path, monkeypatch, base_checkpoint):
    # base_checkpoint: the recipe's model is built before, so that its first build's log never ends a case's output
    code, output = run_case(case, tmp_path, monkeypatch)
    assert code != 0, output
    assert "Traceback" not in output, output
    last = [line for line in output.splitlines() if line.strip()][-1]
    assert last.startswith("rollflow") and case.needle in last, output
    # the page's table is what the cases print (regenerate it with `python bench/bad_inputs.py --page`)
    assert page_rows(TABLE)[CASES.index(case)] == table_row(case, code, last, tmp_path)


def test_the_page_lists_every_case_in_order_under_its_counts():
    rows = page_rows(TABLE)
    assert [r.split(" | ")[:2] for r in rows] == [[f"| {c.kind}", c.what] for c in CASES]
    # the text around the table is the generator's, with counts of today's CASES
    assert render_page(rows) == TABLE, "regenerate with `python bench/bad_inputs.py --page`"
