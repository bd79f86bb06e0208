"""What a run says while it runs: metric lines (`rollout N: {...}`) and notices (resuming, a retried stage, ...).

Each line goes to the current Prefect run's logger. So it lands in the UI's Logs tab, in the run's
`logs/run.log` and, with `rollflow run --verbose`, on the console. Outside a Prefect run it is printed. The
parent flow cannot rely on `log_prints` for this: after its first child flow run ends, Prefect has restored the
builtin `print`, and the parent's prints went straight to stdout.

In-process listeners (the quiet console of `rollflow run`, the run report behind the Prefect UI's summary)
subscribe here to receive every metric record and notice as it is made, without re-reading metrics.jsonl.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Listener(Protocol):
    """Receives what the run reports, in the process that reports it."""

    def on_record(self, run_dir: Path, record: dict[str, Any]) -> None:
        """A metrics.jsonl record was appended to `run_dir`'s metrics.jsonl."""

    def on_notice(self, text: str, level: int) -> None:
        """A notice worth a console line even when the console is quiet."""


_LISTENERS: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    """Add `listener`; returns the function that removes it again."""
    _LISTENERS.append(listener)

    def unsubscribe() -> None:
        if listener in _LISTENERS:
            _LISTENERS.remove(listener)

    return unsubscribe


def say(line: str, level: int = logging.INFO) -> None:
    """Write `line` to the current Prefect run's log at `level`, or print it when no run is active."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        logger = get_run_logger()
    except MissingContextError:
        print(line, flush=True)
        return
    logger.log(level, line)


def notice(text: str, level: int = logging.INFO) -> None:
    """`say` the text, and hand it to every listener (a quiet console shows it)."""
    say(text, level)
    for listener in list(_LISTENERS):
        listener.on_notice(text, level)


def publish_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Hand a just-written metrics.jsonl record of `run_dir` to every listener."""
    for listener in list(_LISTENERS):
        listener.on_record(run_dir, record)
