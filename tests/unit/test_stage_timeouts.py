"""A stage timeout's last line says truthfully whether the stage will be retried (--task-retries, the attempt)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from config import RunConfig
from tasks import notify
from tasks.recovery import ActorLost, guarded, retry_outlook


class _Notices:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def on_notice(self, text: str, level: int) -> None:
        self.seen.append((text, level))


@pytest.mark.parametrize(
    "run_count, retries, outlook",
    [
        ("1", 2, "the stage will be retried (attempt 2 of 3)"),
        ("2", 2, "the stage will be retried (attempt 3 of 3)"),
        ("3", 2, "the stage will not be retried (attempt 3 of 3 failed; --task-retries 2)"),
        ("1", 0, "the stage will not be retried (attempt 1 of 1 failed; --task-retries 0)"),
    ],
)
def test_a_stage_timeout_says_whether_the_stage_will_be_retried(monkeypatch, run_count, retries, outlook):
    monkeypatch.setenv("PREFECT__RUNTIME__TASK_RUN__RUN_COUNT", run_count)
    cfg = RunConfig.model_validate({"faults": {"task_retries": retries}})
    notices = _Notices()
    unsubscribe = notify.subscribe(notices)  # type: ignore[arg-type]
    try:
        with pytest.raises(ActorLost) as lost:
            asyncio.run(guarded(cfg, "generate 1", asyncio.sleep(30), 0.2))
    finally:
        unsubscribe()
    line = f"generate 1: no answer within 0.2 s; every actor answers; {outlook}"
    assert str(lost.value) == line
    assert notices.seen == [(line, logging.WARNING)]


def test_outside_a_prefect_task_nothing_retries():
    assert retry_outlook(2, None) == "the stage will not be retried (it does not run as a Prefect task)"
