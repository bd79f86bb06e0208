"""flows/children.py against a real Prefect server: child flow runs made one ahead are subflows of the parent
like Prefect's own, named, with every parameter recorded, and one that never runs is deleted."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow

from flows.children import ChildRuns
from flows.runtime import rollout_begun

pytestmark = pytest.mark.e2e


@flow(name="child", flow_run_name="child-{n}")
async def child(n: int, late: str) -> int:
    rollout_begun("test-session")  # as a rollout flow run's body begins
    await asyncio.sleep(0.5)  # the stages: time for the next child's run to be made meanwhile
    return n * 10


@flow(name="parent")
async def parent(children: int, stop_after: int) -> list[int]:
    runs = ChildRuns(child, "test-session")
    out = []
    try:
        for n in range(stop_after):  # as flows/run.py does: the next child's run is made while this one runs
            ahead = {"n": n + 1} if n + 1 < children else None
            state = await runs.run({"n": n, "late": f"known at {n}"}, ahead)
            out.append(await state.result())
    finally:
        await runs.close()
    return out


async def _children(parent_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id]))
        )
        tracking = [await client.read_task_run(r.parent_task_run_id) for r in runs]
        parent_tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id={"any_": [parent_id]})  # type: ignore[arg-type]
        )
    return sorted(runs, key=lambda r: r.name), tracking, parent_tasks


def test_children_made_ahead_are_subflows_with_their_parameters(prefect_server):
    state = asyncio.run(parent(3, 3, return_state=True))
    assert state.result() == [0, 10, 20]
    runs, tracking, _ = asyncio.run(_children(state.state_details.flow_run_id))
    assert [r.name for r in runs] == ["child-0", "child-1", "child-2"]  # 0: Prefect's own call; 1, 2: ahead
    assert all(r.state.is_completed() for r in runs)
    assert all(b.created < a.end_time for a, b in zip(runs, runs[1:], strict=False))  # made ahead
    assert [r.parameters for r in runs] == [{"n": n, "late": f"known at {n}"} for n in range(3)]
    assert {t.flow_run_id for t in tracking} == {state.state_details.flow_run_id}
    assert len({t.id for t in tracking}) == 3  # one tracking task run each, as Prefect numbers them


def test_a_child_made_ahead_that_never_runs_is_deleted(prefect_server):
    state = asyncio.run(parent(3, 2, return_state=True))  # child-2 is made while child-1 runs, then not run
    assert state.result() == [0, 10]
    runs, _, parent_tasks = asyncio.run(_children(state.state_details.flow_run_id))
    assert [r.name for r in runs] == ["child-0", "child-1"]
    assert len(parent_tasks) == 2  # its tracking task run went with it
