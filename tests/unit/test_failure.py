"""The root cause of a failed run, unwrapped from real Ray and Prefect wrappers (flows/failure.py)."""

from __future__ import annotations

import asyncio
import traceback

from prefect.exceptions import FailedRun
from prefect.states import (
    Crashed,
    Failed,
    aget_state_exception,
    exception_to_crashed_state,
    exception_to_failed_state,
)
from ray.exceptions import RayTaskError

from faults.injector import FiredFault
from flows.failure import describe, explain, failure_line, note_stage, root_cause, unwrap_text
from tasks.checks import CheckFailed

FAULT = "fault hook r: raise at engine_generate_start in engine-0 weight_version 1 rollout_id 1 attempt 0: injected failure"


def _raised(exc: BaseException) -> BaseException:
    """`exc` with a traceback, as it is after being raised."""
    try:
        raise exc
    except BaseException as e:
        return e


def ray_error(cause: BaseException, function: str = "EngineActor.generate") -> RayTaskError:
    """The exception the driver gets for `cause` raised in an actor method: Ray's dual `RayTaskError(X)`."""
    cause = _raised(cause)
    tb = "".join(traceback.format_exception(cause))
    return RayTaskError(
        function,
        tb,
        cause,
        proctitle=f"ray::{function}",
        pid=4242,
        ip="10.1.2.3",
        actor_repr="<engines.actor.EngineActor object at 0x7f00>",
    ).as_instanceof_cause()


def test_ray_wrapper_is_unwrapped_to_the_actors_exception():
    err = ray_error(FiredFault(FAULT))
    assert isinstance(err, FiredFault) and "ray::EngineActor.generate" in str(err) and "\x1b[" in str(err)
    assert isinstance(root_cause(err), FiredFault) and root_cause(err) is err.cause
    assert describe(err) == f"FiredFault: {FAULT}"


def test_nested_ray_wrappers_unwrap_to_the_innermost_cause():
    """An engine that waited for the trainer's export: the trainer's error inside the engine's."""
    inner = ray_error(
        ValueError("tensor model.norm.weight has shape (8,), expected (16,)"), "TrainerActor.export_weights"
    )
    outer = ray_error(inner, "EngineActor.update_weights")
    assert describe(outer) == "ValueError: tensor model.norm.weight has shape (8,), expected (16,)"


def test_stage_note_names_rollout_and_stage_once():
    err = ray_error(FiredFault(FAULT))
    note_stage(err, 1, "generate")
    note_stage(err, 1, "rollout")  # an outer layer does not overwrite the stage the exception came from
    assert failure_line(err) == f"rollflow: run failed at rollout 1, stage generate: FiredFault: {FAULT}"
    assert explain(err) == f"FiredFault: {FAULT} (rollout 1, stage generate)"
    assert (
        failure_line(CheckFailed("[metric checker] eval/x = [] violates >= 0.5"))
        == "rollflow: run failed: CheckFailed: [metric checker] eval/x = [] violates >= 0.5"
    )


def test_failed_state_with_its_exception_gives_the_exception_itself():
    check = _raised(CheckFailed("[KL checker] train/ppo_kl = 0.0123 violates |x| < 1e-9 at rollout 0 step 0"))

    async def exception() -> BaseException:
        state = await exception_to_failed_state(check, message="Flow run encountered an exception:")
        return await aget_state_exception(state)

    got = asyncio.run(exception())
    assert got is check
    assert (
        describe(got)
        == "CheckFailed: [KL checker] train/ppo_kl = 0.0123 violates |x| < 1e-9 at rollout 0 step 0"
    )


def test_failed_state_read_back_as_text_loses_prefect_and_ray_wrappers():
    """A state read back from the API holds only its message: Prefect's prefix, Ray's header, the remote
    traceback and colour codes around the actor's exception."""

    async def exception() -> BaseException:
        state = await exception_to_failed_state(
            ray_error(FiredFault(FAULT)), message="Flow run encountered an exception:"
        )
        return await aget_state_exception(Failed(message=state.message))  # no data: as read from the server

    got = asyncio.run(exception())
    assert isinstance(got, FailedRun) and str(got).startswith(
        "Flow run encountered an exception: RayTaskError("
    )
    assert "\x1b[36mray::EngineActor.generate" in str(got)
    assert describe(got) == f"FiredFault: {FAULT}"


def test_crashed_state_message_is_unwrapped():
    async def exception() -> BaseException:
        state = await exception_to_crashed_state(_raised(ConnectionResetError("the engine's socket closed")))
        return await aget_state_exception(Crashed(message=state.message))

    got = asyncio.run(exception())
    assert describe(got) == "ConnectionResetError: the engine's socket closed"


def test_text_without_ray_keeps_its_message_and_collapses_whitespace():
    assert (
        unwrap_text("Task run encountered an exception CheckFailed: [log-probs checker] x")
        == "CheckFailed: [log-probs checker] x"
    )
    multi = RuntimeError("rollout 3: engines [0] do not hold the trainer's weights\n\tafter the sync")
    assert (
        describe(multi)
        == "RuntimeError: rollout 3: engines [0] do not hold the trainer's weights after the sync"
    )


def test_exception_group_of_one_is_unwrapped():
    group = ExceptionGroup("unhandled errors in a TaskGroup", [ray_error(FiredFault(FAULT))])
    assert describe(group) == f"FiredFault: {FAULT}"


def test_a_stage_raises_what_the_actor_raised_without_colour_codes_its_remote_traceback_a_note():
    from engines.base import StaleWeights
    from tasks.recovery import unwrapped

    message = "rollout 3, generate: engine 0 holds weight version 2 but the call names version 3"
    err = unwrapped(ray_error(StaleWeights(message)))
    assert type(err) is StaleWeights and str(err) == message  # what Prefect's state message shows
    (note,) = err.__notes__
    assert "ray::EngineActor.generate" in note and "\x1b[" not in note
