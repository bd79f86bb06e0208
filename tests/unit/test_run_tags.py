"""What a Prefect user sees of a run besides its tasks: the tags its flow runs carry (CLI, served and deployed
runs alike) and the console notice of a stage that runs again after a failure."""

from __future__ import annotations

import logging

import yaml

from config import RunConfig
from flows.run import run_tags
from tasks import notify
from tasks.actors import stage_context


def test_a_runs_tags_name_its_recipe_backends_and_the_ci_harness():
    assert run_tags(RunConfig()) == ["rollflow", "recipe:tiny-arith", "rollout:torch", "train:torch"]
    ci = RunConfig.model_validate({"recipe": "long-arith", "ci": {"ci_test": True}})
    assert run_tags(ci) == ["rollflow", "recipe:long-arith", "rollout:torch", "train:torch", "ci-test"]


def test_the_deployed_run_carries_the_tags_of_its_config():
    with open("prefect.yaml") as f:
        run = yaml.safe_load(f)["deployments"][0]
    assert run["tags"] == run_tags(RunConfig())


class _Notices:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def on_notice(self, text: str, level: int) -> None:
        self.seen.append((text, level))


def test_a_retried_stage_says_so_on_the_console_and_a_first_attempt_does_not(monkeypatch):
    notices = _Notices()
    unsubscribe = notify.subscribe(notices)  # type: ignore[arg-type]
    try:
        monkeypatch.setenv("PREFECT__RUNTIME__TASK_RUN__RUN_COUNT", "1")
        assert stage_context(3, "log-prob") == {"rollout_id": 3, "attempt": 0, "stage": "log-prob"}
        assert notices.seen == []
        monkeypatch.setenv("PREFECT__RUNTIME__TASK_RUN__RUN_COUNT", "2")
        assert stage_context(3, "log-prob")["attempt"] == 1
        assert stage_context(4, "eval")["attempt"] == 1
    finally:
        unsubscribe()
    assert notices.seen == [
        ("rollout 3: retrying log-prob (attempt 2)", logging.WARNING),
        ("eval 4: retrying eval (attempt 2)", logging.WARNING),
    ]
