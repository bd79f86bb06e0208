"""The parent's own tasks (the first sync, the checkpoint save) follow the run's retry policy (--task-retries,
--task-retry-delay, checker failures never retried) like the stages do. A save that a fault cut was once not
retried although its ActorLost said it would be (bench/faults.py found it)."""

from __future__ import annotations

from config import RunConfig
from flows.run import with_retries
from tasks.checks import retry_unless_check_failed
from tasks.stages import save_checkpoint, sync


def _cfg(retries: int, delay: float) -> RunConfig:
    cfg = RunConfig()
    return cfg.model_copy(
        update={"faults": cfg.faults.model_copy(update={"task_retries": retries, "task_retry_delay": delay})}
    )


def test_the_parents_own_tasks_retry_like_the_stages():
    cfg = _cfg(3, 0.5)
    for task in (save_checkpoint, sync):
        configured = with_retries(cfg, task)
        assert (configured.retries, configured.retry_delay_seconds) == (3, 0.5)
        assert configured.retry_condition_fn is retry_unless_check_failed
    assert save_checkpoint.retries == 0  # the task itself is unchanged
