"""The stage tasks of a rollout, configured in one place: the run's retry policy and `--refresh`, for the rollout
flow, the parent's own tasks and `rollflow replay` alike."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast

from prefect import Task
from prefect.utilities.annotations import NotSet, quote

from config import RunConfig
from config.stages import STAGES, check_stages
from flows.failure import note_stage
from tasks.checks import retry_unless_check_failed
from tasks.recordings import inject, load_rollout
from tasks.stages import check, evaluate, generate, log_prob, save_rollout, sync, train_step

P = ParamSpec("P")
R = TypeVar("R")

TASKS: dict[str, Task[..., Any]] = {
    "generate": generate,
    "load-rollout": load_rollout,
    "inject": inject,
    "save-rollout": save_rollout,
    "log-prob": log_prob,
    "train-step": train_step,
    "sync": sync,
    "check": check,
    "eval": evaluate,
}
assert tuple(TASKS) == STAGES, "config.stages.STAGES names every stage task, in order"


def with_policy(cfg: RunConfig, task: Task[P, R], refresh: bool = False) -> Task[P, R]:
    """`task` with the run's retry policy (--task-retries attempts, --task-retry-delay apart; a checker's failure
    is never retried) and, with `refresh`, its cache bypassed."""
    return cast(
        Task[P, R], _with_options(task, cfg.faults.task_retries, cfg.faults.task_retry_delay, refresh)
    )


@functools.cache  # every `Task.with_options` copy reads the task's source again: one per task and policy
def _with_options(task: Task[..., Any], retries: int, delay: float, refresh: bool) -> Task[..., Any]:
    return task.with_options(
        retries=retries,
        retry_delay_seconds=delay,
        retry_condition_fn=retry_unless_check_failed,
        refresh_cache=True if refresh else NotSet,
    )


def opaque_config(cfg: RunConfig) -> RunConfig:
    """`cfg` marked so Prefect passes it to tasks without walking every field of it (looking for futures to wait
    on) on each call. The task still receives the RunConfig itself, and cache keys still see it."""
    return cast(RunConfig, quote(cfg))


class Stages:
    """The stage tasks of one rollout, one attribute each, under the run's policy (`with_policy`) with the
    `refresh` ones forced; counts the task runs started. An exception a stage raises carries its rollout and
    stage (`flows.failure.note_stage`)."""

    def __init__(self, cfg: RunConfig, refresh: list[str], rollout_id: int) -> None:
        check_stages(refresh, "--refresh")
        self.cfg, self.refresh, self.rollout_id, self.started = cfg, refresh, rollout_id, 0
        self.generate = self._stage("generate", generate)
        self.load_rollout = self._stage("load-rollout", load_rollout)
        self.inject = self._stage("inject", inject)
        self.save_rollout = self._stage("save-rollout", save_rollout)
        self.log_prob = self._stage("log-prob", log_prob)
        self.train_step = self._stage("train-step", train_step)
        self.sync = self._stage("sync", sync)
        self.check = self._stage("check", check)
        self.eval = self._stage("eval", evaluate)

    def _stage(self, name: str, task: Task[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        configured = with_policy(self.cfg, task, name in self.refresh)

        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            self.started += 1
            try:
                return await configured(*args, **kwargs)
            except Exception as e:
                note_stage(e, self.rollout_id, name)
                raise

        return run
