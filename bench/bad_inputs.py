"""Every bad input and hostile file of tests/bad_inputs.py, run through `rollflow` in this process with the
points where work would start replaced by a refusal, printed as the README's markdown table: the case, the exit
code and the one line it was refused with.

    python bench/bad_inputs.py > /tmp/table.md
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
    import deployments.serve
    import flows.cli
    import flows.reaper
    from tests.bad_inputs import CASES

    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("not refused: the command would have started work")

    flows.reaper.start_reaper = refuse  # type: ignore[assignment]
    deployments.serve.serve_run = refuse  # type: ignore[assignment]
    flows.cli._start_replay = refuse  # type: ignore[assignment]
    tmp = Path(tempfile.mkdtemp(prefix="rf-bench-bad-"))
    rows, refused = [], 0
    for case in CASES:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = flows.cli.main(case.argv(tmp))
            except SystemExit as e:
                code = int(e.code or 0)
            except RuntimeError as e:
                code, out = -1, io.StringIO(str(e))
        lines = [line for line in out.getvalue().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        ok = code not in (0, -1) and "Traceback" not in out.getvalue() and case.needle in last
        refused += ok
        message = last.replace(str(tmp), "$TMP").replace("|", "\\|")
        rows.append(f"| {case.kind} | {case.what} | {code} | `{message[:150]}` |")
    print("| class | bad input | exit | refused with (one line) |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\n{refused} of {len(CASES)} refused before any work with one line naming the flag or file",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
