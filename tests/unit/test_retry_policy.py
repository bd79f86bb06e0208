"""One retry policy: every stage task, the parent's own tasks (the first sync, the checkpoint save) and a replay's
stages take --task-retries and --task-retry-delay from the run's config, checker failures never retried; the task
decorators carry none of their own, so nothing retries by another rule."""

from __future__ import annotations

import pytest

from config import RunConfig
from config.stages import STAGES
from flows.stages import TASKS, Stages, with_policy
from tasks.checks import CheckFailed, retry_unless_check_failed
from tasks.stages import save_checkpoint, sync


def _cfg(retries: int, delay: float) -> RunConfig:
    cfg = RunConfig()
    return cfg.model_copy(
        update={"faults": cfg.faults.model_copy(update={"task_retries": retries, "task_retry_delay": delay})}
    )


def test_the_parents_own_tasks_retry_like_the_stages():
    cfg = _cfg(3, 0.5)
    for task in (save_checkpoint, sync, *TASKS.values()):
        configured = with_policy(cfg, task)
        assert (configured.retries, configured.retry_delay_seconds) == (3, 0.5)
        assert configured.retry_condition_fn is retry_unless_check_failed


@pytest.mark.parametrize("name", STAGES)
def test_no_stage_task_carries_a_retry_policy_of_its_own(name):
    assert TASKS[name].retries == 0 and TASKS[name].retry_condition_fn is None


def test_refresh_forces_only_the_named_stages_and_unknown_names_are_refused():
    assert with_policy(_cfg(2, 1), TASKS["log-prob"], refresh=True).refresh_cache is True
    assert with_policy(_cfg(2, 1), TASKS["log-prob"]).refresh_cache is not True
    with pytest.raises(ValueError, match=r"--refresh: unknown stage\(s\) \['train'\]"):
        Stages(_cfg(2, 1), ["train"], 0)


def test_a_checker_failure_is_not_retried_and_anything_else_is():
    class State:
        def __init__(self, data):
            self.data = data

    assert not retry_unless_check_failed(None, None, State(CheckFailed("kl")))
    assert retry_unless_check_failed(None, None, State(RuntimeError("disk full")))
