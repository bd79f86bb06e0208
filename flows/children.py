"""The `rollout-<id>` child flow runs of a run, each created while the one before it runs.

Calling a subflow makes Prefect create it on the spot: a task run in the parent that tracks it, a lookup for an
earlier attempt of it, the flow's upsert, the flow run and its name: five API round trips (measured: ~70 ms of
the ~150 ms between two rollouts) while the actors wait. `ChildRuns` makes rollout N+1's tracking task run and
flow run (Pending, named, a subflow of the run like any other) as soon as rollout N's flow run has saved its
rollout (`runtime.rollout_saved`: its trainers' stages run then), so that between two rollouts only the runs'
own state changes remain; Prefect's flow engine then runs the body in the flow run given to it, as a worker
runs a deployment's. The one parameter not known ahead, the weights the rollout starts from (rollout N's
result), is written to the flow run once it starts, off the loop's path.

Prefect's engine, given a run made ahead, first writes that run's flow version and retry policy again (one more
round trip, and a write the server's SQLite takes while the previous child records its final state): a write of
exactly the values the run was created with is skipped (`_skip_rewrites_of_runs_made_ahead`).

A run created ahead that never starts (the run failed or stopped before it) is deleted with its tracking task
run. The first rollout of a run (and any whose run could not be made ahead) is a plain subflow call.

The parent goes on with a child's result as soon as the child's body returns it (`runtime.rollout_returning`),
while Prefect records the run's final state: a state change (~20-35 ms) that would otherwise sit between two
rollouts with the actors idle. That final state is checked when the next child returns (or at `finish`); a run
that does not end Completed raises its error there.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from typing import Any

import httpx
from prefect import Flow, Task
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, TagsContext
from prefect.flow_engine import run_flow_async
from prefect.states import Pending, State

from flows.runtime import on_rollout_returning, on_rollout_saved
from tasks import notify


class ChildRuns:
    """The child flow runs of the parent flow run this is made in (its context is kept: a run made ahead is
    created from within a child's body, when the run loop `session` hears that the child has saved its rollout),
    in order."""

    def __init__(self, flow: Flow[..., Any], session: str) -> None:
        assert isinstance(flow.flow_run_name, str), "a run made ahead is named from the flow's name template"
        self.flow, self._template = flow, flow.flow_run_name
        self._parent = contextvars.copy_context()
        # the same flow without its run-name template: a run made ahead is named at creation (Prefect would
        # rename it, one more round trip)
        self._named_ahead = flow.with_options()
        self._named_ahead.flow_run_name = None
        self._tracking = Task(name=flow.name, fn=flow.fn, version=flow.version)
        setattr(self._tracking, "_is_subflow_tracking_task", True)  # noqa: B010 -- as Prefect's subflow call marks it
        self._next: dict[str, Any] | None = None  # known parameters of the run after the one in progress
        self._ahead: tuple[str, asyncio.Task[FlowRun]] | None = None  # (its name, its creation)
        self._unwritten: tuple[FlowRun, dict[str, Any]] | None = None  # parameters of the run in progress
        # the child in progress's (result, flow run id), once its body returns them
        self._returned: asyncio.Future[tuple[Any, uuid.UUID | None]] | None = None
        # the last child's engine, recording its final state
        self._finishing: asyncio.Task[State] | None = None
        _skip_rewrites_of_runs_made_ahead()
        stop_saved = on_rollout_saved(session, self._saved)
        stop_returning = on_rollout_returning(session, self._returning)
        self._stop_listening = lambda: (stop_saved(), stop_returning())

    async def run(
        self, parameters: dict[str, Any], ahead: dict[str, Any] | None = None
    ) -> tuple[Any, uuid.UUID | None]:
        """Run the child flow run with `parameters` (in the run made for it ahead, if there is one); its result
        and flow run id as soon as its body returns them (`runtime.rollout_returning`: Prefect records its final
        state meanwhile). A body that raises, or never tells its result, is waited for to its final state, and
        that state's error is raised. First raises the previous child's, if its run did not end Completed.
        `ahead`: the parameters known now of the child that follows, made once this one has saved its rollout
        (the rest are written when it starts)."""
        self._next = ahead
        flow_run = await self._take(self._template.format(**parameters))
        call: Any
        if flow_run is None:
            # Prefect's own subflow call waits (seconds, measured) while the previous child is still finishing
            await self.finish()
            call = self.flow(**parameters, return_state=True)  # a coroutine: the flow is async
        else:
            missing = {k: v for k, v in parameters.items() if k not in flow_run.parameters}
            if missing:  # the UI shows the run's parameters as it was called
                self._unwritten = (flow_run, missing)
            call = run_flow_async(
                self._named_ahead, flow_run=flow_run, parameters=parameters, return_type="state"
            )
        returned = self._returned = asyncio.get_running_loop().create_future()
        running: asyncio.Task[State] = asyncio.ensure_future(call)
        try:
            await asyncio.wait([running, returned], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            running.cancel()
            raise
        finally:
            self._returned = None
        previous, self._finishing = self._finishing, running  # awaited by finish() or close() from now on
        await _settled(previous)  # the previous child's final state, recorded while this one ran
        if returned.done():
            return returned.result()
        self._finishing = None
        state = running.result()
        return await state.result(), state.state_details.flow_run_id  # type: ignore[misc]  # raises its error

    async def finish(self) -> None:
        """Wait for the last child's run to be recorded in its final state; raise its error unless Completed."""
        finishing, self._finishing = self._finishing, None
        await _settled(finishing)

    async def close(self) -> None:
        """Stop listening; wait for the last child's final state; write what is left of the parameters; delete a
        run made ahead that will not run (with its tracking task run). Never raises: reported as a notice."""
        self._stop_listening()
        self._next = None
        try:
            await self.finish()
        except Exception as e:
            _report("the last rollout flow run did not end Completed", e)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await self._delete(*ahead)
            return
        try:
            await self._write_parameters()
        except Exception as e:
            _report("could not record the last rollout flow run's parameters", e)

    def _saved(self) -> None:
        """The child in progress has saved its rollout: make the next one in the background (from the parent's
        context)."""
        known, self._next = self._next, None
        if known is not None and self._ahead is None:
            creating = asyncio.get_running_loop().create_task(self._create(known), context=self._parent)
            self._ahead = (self._template.format(**known), creating)

    def _returning(self, result: Any) -> None:
        """The child in progress's body returns `result` (called in its context: its flow run is the current one)."""
        if self._returned is not None and not self._returned.done():
            ctx = FlowRunContext.get()
            self._returned.set_result((result, ctx.flow_run.id if ctx and ctx.flow_run else None))

    async def _take(self, name: str) -> FlowRun | None:
        """The run made ahead if it is `name`'s (one made for another is deleted)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead[0] != name:
            await self._delete(*ahead)
            return None
        try:
            return await ahead[1]
        except Exception as e:  # the plain subflow call makes it instead
            _report(f"could not create {name}'s flow run ahead", e)
            return None

    async def _create(self, parameters: dict[str, Any]) -> FlowRun:
        """What Prefect's subflow call does before it runs the body: the tracking task run in the parent (the
        next one of its kind: Prefect numbers them in call order) and a Pending flow run under it. First, the
        parameters of the run in progress (written now, not as it starts: the server takes one write at a time)."""
        try:
            await self._write_parameters()
        except Exception as e:
            _report("could not record a rollout flow run's parameters", e)
        tracking = await self._tracking.create_run(
            flow_run_context=FlowRunContext.get(), parameters=parameters
        )
        async with get_client() as client:
            flow_run = await client.create_flow_run(
                self.flow,
                name=self._template.format(**parameters),
                parameters=self.flow.serialize_parameters(parameters),
                state=Pending(),
                parent_task_run_id=tracking.id,
                tags=TagsContext.get().current_tags,
            )
        _CREATED[flow_run.id] = (flow_run.flow_version, flow_run.empirical_policy.model_dump())
        return flow_run

    async def _write_parameters(self) -> None:
        if self._unwritten is None:
            return
        (flow_run, missing), self._unwritten = self._unwritten, None
        async with get_client() as client:
            await client.update_flow_run(
                flow_run.id, parameters={**flow_run.parameters, **self.flow.serialize_parameters(missing)}
            )

    async def _delete(self, name: str, creating: asyncio.Task[FlowRun]) -> None:
        """Delete a run made ahead that will never start, and its tracking task run."""
        try:
            flow_run = await creating
            _CREATED.pop(flow_run.id, None)
            async with get_client() as client:
                await client.delete_flow_run(flow_run.id)
                if flow_run.parent_task_run_id is not None:
                    await client.delete_task_run(flow_run.parent_task_run_id)
        except Exception as e:
            _report(f"could not delete {name}'s flow run, made ahead and never started", e)


# flow run made ahead -> the (flow version, retry policy) it was created with, until the engine's first update
_CREATED: dict[uuid.UUID, tuple[str | None, dict[str, Any]]] = {}


def _skip_rewrites_of_runs_made_ahead() -> None:
    """Make `PrefectClient.update_flow_run` skip the first update of a run made ahead when it writes only its
    flow version and retry policy, each equal to what the run was created with (the engine's update when it
    starts such a run: `AsyncFlowRunEngine.initialize_run`). Any other update goes to the server. Idempotent."""
    original = PrefectClient.update_flow_run
    if getattr(original, "_rollflow_skips", False):
        return

    async def update_flow_run(self: PrefectClient, flow_run_id: uuid.UUID, *args: Any, **kwargs: Any) -> Any:
        engines_update = not args and set(kwargs) <= {"flow_version", "empirical_policy"}
        created = _CREATED.pop(flow_run_id, None) if engines_update else None
        policy = kwargs.get("empirical_policy")
        if (
            created is not None
            and kwargs.get("flow_version") == created[0]
            and policy is not None
            and policy.model_dump() == created[1]
        ):
            return httpx.Response(204)  # what the server answers a PATCH; the engine does not read it
        return await original(self, flow_run_id, *args, **kwargs)

    update_flow_run._rollflow_skips = True  # type: ignore[attr-defined]
    PrefectClient.update_flow_run = update_flow_run  # type: ignore[method-assign,assignment]


async def _settled(finishing: asyncio.Task[State] | None) -> None:
    """Wait for a child's engine to record its run's final state; raise that run's error unless Completed."""
    if finishing is None:
        return
    state = await finishing
    if not state.is_completed():
        await state.result()  # type: ignore[misc]  # raises the run's error
        raise RuntimeError(f"flow run {state.state_details.flow_run_id} ended {state.name}")


def _report(what: str, e: BaseException) -> None:
    notify.notice(f"{what}: {type(e).__name__}: {e}", logging.WARNING)
