"""flows.spans: timeline events to actor calls, task run names to stages, calls checked against task runs."""

from __future__ import annotations

import math

import pytest

from flows.spans import (
    METHOD_STAGES,
    STAGES,
    Call,
    FlowRunSpan,
    RunSpans,
    TaskRun,
    actor_calls,
    attribute,
    stage_of,
)

T0 = 1_800_000_000.0  # seconds since the epoch, as both clocks read them


def event(cat: str, start_ms: float, dur_ms: float, task_id: str = "aa" * 20 + "01000000") -> dict:
    """A chrome-trace event as `ray.timeline()` writes an actor call (microseconds since the epoch)."""
    return {
        "cat": cat,
        "name": cat.rsplit(".", 1)[-1],
        "pid": "127.0.0.1",
        "tid": "worker:ab",
        "ts": (T0 + start_ms / 1000) * 1e6,
        "dur": dur_ms * 1000,
        "ph": "X",
        "args": {"task_id": task_id},
    }


def test_actor_calls_are_the_task_events_in_seconds_with_the_method_named_by_class():
    events = [
        event("task::EngineActor.generate", 10, 5),
        event("task:execute", 10, 4),  # the phases of a call: not calls
        event("submit_task", 9, 1),
        event("task::engine-0:EngineActor.__init__", 0, 3),  # a named actor's creation
    ]
    calls = actor_calls(events)
    assert [c.method for c in calls] == ["EngineActor.__init__", "EngineActor.generate"]
    assert calls[1].start == pytest.approx(T0 + 0.010) and calls[1].end == pytest.approx(T0 + 0.015)


def test_actor_calls_keep_one_job_and_a_window():
    events = [
        event("task::EngineActor.generate", 10, 5),
        event("task::EngineActor.health", 20, 1, task_id="bb" * 20 + "02000000"),
        event("task::TrainerActor.save", 100, 5),
    ]
    assert [c.method for c in actor_calls(events, job_id="01000000")] == [
        "EngineActor.generate",
        "TrainerActor.save",
    ]
    # a call overlapping the window's edge is kept
    assert [c.method for c in actor_calls(events, window=(T0 + 0.012, T0 + 0.05))] == [
        "EngineActor.generate",
        "EngineActor.health",
    ]


@pytest.mark.parametrize(
    ("name", "key", "stage"),
    [
        ("log-prob-0", None, "log-prob"),
        ("save-rollout-12", "12", "save-rollout"),
        ("train-step-a1b", "a1b2c3d4", "train-step"),
        ("sync-3", None, "sync"),
    ],
)
def test_stage_of_a_task_run_name(name, key, stage):
    assert stage_of(name, key) == stage


def test_the_mapping_names_only_known_stages():
    assert set(STAGES) == {"generate", "eval", "log-prob", "train-step", "sync", "check", "save"}
    assert all(isinstance(stages, tuple) and stages for stages in METHOD_STAGES.values())


def ms(x: float) -> float:
    return T0 + x / 1000


def spans(*tasks: tuple[str, float, float]) -> RunSpans:
    """One rollout flow run from 0 to 1000 ms holding the given (stage, start ms, end ms) task runs."""
    return RunSpans(
        FlowRunSpan("run/x", ms(-500), ms(1500)),
        [FlowRunSpan("rollout-0", ms(0), ms(1000))],
        [TaskRun(stage, "rollout-0", ms(a), ms(b)) for stage, a, b in tasks],
    )


def call(method: str, a: float, b: float) -> Call:
    return Call(method, ms(a), ms(b))


def test_a_call_inside_its_task_run():
    report = attribute([call("EngineActor.generate", 110, 190)], spans(("generate", 100, 200)))
    assert report.stages["generate"].calls == 1 and report.violations == 0


def test_a_call_before_its_task_run_starts_is_an_early_violation():
    report = attribute(
        [call("TrainerActor.train_step", 250, 320)], spans(("log-prob", 100, 200), ("train-step", 300, 400))
    )
    row = report.stages["train-step"]
    assert (row.calls, row.early, row.late) == (1, 1, 0)
    assert row.worst_ms == pytest.approx(50) and row.offenders == {"TrainerActor.train_step": 1}
    assert report.violations == 1 and "train-step" in report.table()


def test_a_call_outlasting_its_task_run_is_a_late_violation():
    report = attribute([call("TrainerActor.compute_log_probs", 150, 230)], spans(("log-prob", 100, 200)))
    row = report.stages["log-prob"]
    assert (row.early, row.late) == (0, 1) and row.worst_ms == pytest.approx(30)


def test_a_call_outside_by_less_than_the_tolerance_is_inside():
    task = spans(("sync", 100, 200))
    assert attribute([call("EngineActor.update_weights", 97, 203)], task).violations == 0
    assert attribute([call("EngineActor.update_weights", 97, 203)], task, tolerance_ms=2).violations == 1


def test_a_call_may_run_in_any_of_its_stages():
    report = attribute(
        [call("EngineActor.generate", 610, 700)], spans(("generate", 100, 200), ("eval", 600, 900))
    )
    assert report.stages["eval"].calls == 1 and report.stages["generate"].calls == 0
    assert report.violations == 0


def test_an_unknown_method_is_the_rest_and_a_violation_only_between_a_rollouts_tasks():
    task = spans(("generate", 100, 200))
    start_up = attribute([call("EngineActor.health", -300, -290)], task)
    assert start_up.other.calls == 1 and start_up.violations == 0
    in_a_task = attribute([call("SomeActor.anything", 120, 130)], task)
    assert in_a_task.other.calls == 1 and in_a_task.violations == 0
    between = attribute([call("EngineActor.health", 300, 310)], task)
    assert between.other.between_tasks == 1 and between.violations == 1
    assert between.other.offenders == {"EngineActor.health": 1}
    assert sum(r.calls for r in between.stages.values()) == 0


def test_the_start_ups_weight_queries_are_allowed_outside_every_rollout_only():
    task = spans(("sync", 100, 200), ("check", 300, 400))
    before = attribute([call("EngineActor.weights_sha256", -100, -90)], task)
    assert before.other.calls == 1 and before.violations == 0
    inside = attribute([call("EngineActor.weights_sha256", 310, 320)], task)
    assert inside.stages["check"].calls == 1 and inside.violations == 0
    between = attribute([call("EngineActor.weights_sha256", 250, 260)], task)
    assert between.stages["check"].early == 1 and between.violations == 1


def test_a_stage_call_with_no_task_run_of_its_stages():
    report = attribute([call("TrainerActor.save", 500, 510)], spans(("generate", 100, 200)))
    row = report.stages["save"]
    assert row.outside == 1 and math.isinf(row.worst_ms) and "no task run" in report.table()


def test_the_parents_task_runs_count_too():
    run = spans()
    run.tasks.append(TaskRun("save", "run/x", ms(1100), ms(1200)))
    assert attribute([call("TrainerActor.save", 1110, 1190)], run).violations == 0


def test_a_call_within_the_tolerance_of_two_task_runs_goes_to_the_one_holding_it():
    report = attribute(
        [call("EngineActor.weight_version", 202, 204)], spans(("sync", 100, 200), ("check", 201, 300))
    )
    assert report.stages["check"].calls == 1 and report.stages["sync"].calls == 0
