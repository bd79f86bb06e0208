"""Every bad input and hostile file of tests/bad_inputs/, run through `rollflow` in this process with the
points where work would start replaced by a refusal: prints each case with its exit code, the seconds to its
refusal and the one line it was refused with, then how many were refused before any work. `--page` also writes
the table (without the seconds, which vary by machine) and its counts as docs/reference/bad-inputs.md, whose
table tests/unit/test_bad_inputs.py checks row by row against what each case prints.

    python bench/bad_inputs.py [--page]
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.cli import configure_prefect_env, configure_ray_env  # noqa: E402

configure_prefect_env()
configure_ray_env()


def main() -> None:
    import argparse
    import time

    import deployments.serve
    import flows.cli
    import flows.reaper
    from tests.bad_inputs import CASES, PAGE, render_page, table_row

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--page", action="store_true", help="write the table and its counts as docs/reference/bad-inputs.md"
    )
    args = parser.parse_args()

    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("not refused: the command would have started work")

    flows.reaper.start_reaper = refuse  # type: ignore[assignment]
    deployments.serve.serve_run = refuse  # type: ignore[assignment]
    flows.cli._start_replay = refuse  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp(prefix="rf-bench-bad-"))
    rows, refused = [], 0
    print("| class | bad input | exit | s | refused with (one line) |\n|---|---|---|---|---|")
    for case in CASES:
        out = io.StringIO()
        began = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = flows.cli.main(case.argv(tmp))
            except SystemExit as e:
                code = int(e.code or 0)
            except RuntimeError as e:
                code, out = -1, io.StringIO(str(e))
        seconds = time.perf_counter() - began
        lines = [line for line in out.getvalue().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        refused += code not in (0, -1) and "Traceback" not in out.getvalue() and case.needle in last
        rows.append(table_row(case, code, last, tmp))
        cells = rows[-1].split(" | ")
        print(" | ".join([*cells[:3], f"{seconds:.2f}", *cells[3:]]), flush=True)
    print(f"\n{refused} of {len(CASES)} refused before any work with one line naming the flag or file")
    if args.page:
        PAGE.write_text(render_page(rows))
        print(f"{PAGE.relative_to(ROOT)}: table of {len(CASES)} cases written", file=sys.stderr)


if __name__ == "__main__":
    main()
