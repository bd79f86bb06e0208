"""The `rollout-<id>` child flow runs of a run, each created while the one before it runs.

Calling a subflow makes Prefect create it on the spot: a task run in the parent that tracks it, a lookup for an
earlier attempt of it, the flow's upsert, the flow run and its name: five API round trips (measured: ~70 ms of
the ~150 ms between two rollouts) while the actors wait. `ChildRuns` makes rollout N+1's tracking task run and
flow run (Pending, named, a subflow of the run like any other) as soon as rollout N's flow run has begun, so
that between two rollouts only the runs' own state changes remain; Prefect's flow engine then runs the body in
the flow run given to it, as a worker runs a deployment's. The one parameter not known ahead, the weights the
rollout starts from (rollout N's result), is written to the flow run once it starts, off the loop's path.

A run created ahead that never starts (the run failed or stopped before it) is deleted with its tracking task
run. The first rollout of a run (and any whose run could not be made ahead) is a plain subflow call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, cast

from prefect import Flow, Task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, TagsContext
from prefect.flow_engine import run_flow_async
from prefect.states import Pending, State

from tasks import notify


class ChildRuns:
    """The child flow runs of the parent flow run this is made in (its context is kept: a run made ahead is
    created from within a child's body), one per rollout id, in order."""

    def __init__(self, flow: Flow[..., Any]) -> None:
        self.flow = flow
        self._parent = contextvars.copy_context()
        # the same flow without its run-name template: a run made ahead is named at creation (Prefect would
        # rename it, one more round trip)
        self._named_ahead = flow.with_options()
        self._named_ahead.flow_run_name = None
        self._tracking = Task(name=flow.name, fn=flow.fn, version=flow.version)
        setattr(self._tracking, "_is_subflow_tracking_task", True)  # noqa: B010 -- as Prefect's subflow call marks it
        self._ahead: tuple[int, asyncio.Task[FlowRun]] | None = None
        self._unwritten: tuple[FlowRun, dict[str, Any]] | None = None  # parameters of the run in progress

    def create_ahead(self, rollout_id: int, name: str, parameters: dict[str, Any]) -> None:
        """Start creating rollout `rollout_id`'s flow run `name` in the background; `parameters` are those
        known now (the rest are written when it starts)."""
        if self._ahead is None:
            creating = asyncio.get_running_loop().create_task(
                self._create(name, parameters), context=self._parent
            )
            self._ahead = (rollout_id, creating)

    async def _create(self, name: str, parameters: dict[str, Any]) -> FlowRun:
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
            return await client.create_flow_run(
                self.flow,
                name=name,
                parameters=self.flow.serialize_parameters(parameters),
                state=Pending(),
                parent_task_run_id=tracking.id,
                tags=TagsContext.get().current_tags,
            )

    async def _write_parameters(self) -> None:
        if self._unwritten is None:
            return
        (flow_run, missing), self._unwritten = self._unwritten, None
        async with get_client() as client:
            await client.update_flow_run(
                flow_run.id, parameters={**flow_run.parameters, **self.flow.serialize_parameters(missing)}
            )

    async def run(self, rollout_id: int, parameters: dict[str, Any]) -> State:
        """Run rollout `rollout_id`'s flow run with `parameters` (in the run made ahead, if there is one) and
        return its final state."""
        flow_run = await self._take(rollout_id)
        if flow_run is None:
            call: Any = self.flow(**parameters, return_state=True)  # a coroutine: the flow is async
            return cast(State, await call)
        missing = {k: v for k, v in parameters.items() if k not in flow_run.parameters}
        if missing:  # the UI shows the run's parameters as it was called
            self._unwritten = (flow_run, missing)
        result = await run_flow_async(
            self._named_ahead, flow_run=flow_run, parameters=parameters, return_type="state"
        )
        assert isinstance(result, State)
        return result

    async def close(self) -> None:
        """Write what is left of the parameters; delete a run made ahead that will not run (with its tracking
        task run). Never raises: reported as a notice."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            try:
                await self._write_parameters()
            except Exception as e:
                _report("could not record the last rollout flow run's parameters", e)
            return
        try:
            flow_run = await ahead[1]
            async with get_client() as client:
                await client.delete_flow_run(flow_run.id)
                if flow_run.parent_task_run_id is not None:
                    await client.delete_task_run(flow_run.parent_task_run_id)
        except Exception as e:
            _report(f"could not delete rollout {ahead[0]}'s flow run, made ahead and never started", e)

    async def _take(self, rollout_id: int) -> FlowRun | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        made_for, creating = ahead
        try:
            flow_run = await creating
        except Exception as e:  # the plain subflow call makes it instead
            _report(f"could not create rollout {made_for}'s flow run ahead", e)
            return None
        if made_for != rollout_id:  # not this rollout's: never started
            self._ahead = ahead
            await self.close()
            return None
        return flow_run


def _report(what: str, e: BaseException) -> None:
    notify.notice(f"{what}: {type(e).__name__}: {e}", logging.WARNING)
