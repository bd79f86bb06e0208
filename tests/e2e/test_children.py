"""flows/children.py against a real Prefect server: child flow runs made one ahead are subflows of the parent
like Prefect's own, named, with every parameter recorded, and one that never runs is deleted; the parent goes on
with a child's result as its body returns it, while Prefect records the run's end."""

from __future__ import annotations

import asyncio
import time

import pytest
from prefect import flow

from flows.children import ChildRuns
from flows.runtime import rollout_returning, rollout_saved

pytestmark = pytest.mark.e2e


@flow(name="child", flow_run_name="child-{n}")
async def child(n: int, late: str) -> int:
    rollout_saved("test-session")  # as a rollout flow run has saved its rollout
    await asyncio.sleep(0.5)  # the stages: time for the next child's run to be made meanwhile
    rollout_returning("test-session", n * 10)
    return n * 10


async def _slow_to_finish(*_: object) -> None:
    await asyncio.sleep(0.9)  # in the child's engine after its body returned, before the run call returns


@flow(name="slow-child", flow_run_name="slow-child-{n}", on_completion=[_slow_to_finish])
async def slow_child(n: int, late: str) -> int:
    rollout_saved("test-session")
    await asyncio.sleep(1.0)
    rollout_returning("test-session", n * 10)
    return n * 10


@flow(name="parent")
async def parent(children: int, stop_after: int, slow: bool = False) -> tuple[list[int], list[float]]:
    runs = ChildRuns(slow_child if slow else child, "test-session")
    out, seconds = [], []
    try:
        for n in range(stop_after):  # as flows/run.py does: the next child's run is made while this one runs
            ahead = {"n": n + 1} if n + 1 < children else None
            began = time.perf_counter()
            result, _ = await runs.run({"n": n, "late": f"known at {n}"}, ahead)
            seconds.append(time.perf_counter() - began)
            out.append(result)
        await runs.finish()
    finally:
        await runs.close()
    return out, seconds


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
    assert state.result()[0] == [0, 10, 20]
    runs, tracking, _ = asyncio.run(_children(state.state_details.flow_run_id))
    assert [r.name for r in runs] == ["child-0", "child-1", "child-2"]  # 0: Prefect's own call; 1, 2: ahead
    assert all(r.state.is_completed() for r in runs)
    assert all(b.created < a.end_time for a, b in zip(runs, runs[1:], strict=False))  # made ahead
    assert [r.parameters for r in runs] == [{"n": n, "late": f"known at {n}"} for n in range(3)]
    assert {t.flow_run_id for t in tracking} == {state.state_details.flow_run_id}
    assert len({t.id for t in tracking}) == 3  # one tracking task run each, as Prefect numbers them


def test_a_child_made_ahead_that_never_runs_is_deleted(prefect_server):
    state = asyncio.run(parent(3, 2, return_state=True))  # child-2 is made while child-1 runs, then not run
    assert state.result()[0] == [0, 10]
    runs, _, parent_tasks = asyncio.run(_children(state.state_details.flow_run_id))
    assert [r.name for r in runs] == ["child-0", "child-1"]
    assert len(parent_tasks) == 2  # its tracking task run went with it


def test_the_parent_goes_on_as_a_childs_body_returns(prefect_server):
    # each child's engine spends 0.9 s after its 1 s body returned (an on-completion hook): the parent goes on
    # without it (the next child's run overlaps it), and every run still ends Completed, the last one awaited
    # by finish()
    began = time.perf_counter()
    state = asyncio.run(parent(3, 3, slow=True, return_state=True))
    out, seconds = state.result()
    assert out == [0, 10, 20]
    assert all(s < 1.8 for s in seconds), seconds  # 1 s of body each, never 1.9 s with the time after it
    assert time.perf_counter() - began >= 3 * 1.0 + 0.9  # the last child's end was waited for
    runs, _, _ = asyncio.run(_children(state.state_details.flow_run_id))
    assert all(r.state.is_completed() for r in runs)
