"""Against a real Prefect server: a run dir's previous parent flow run, left running by a process that is gone, is
marked Crashed with its rollout flow runs; a Prefect retry of that same flow run (running again) marks only the
rollout flow runs its first attempt left running, never itself."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.states import Running

from flows.runtime import crash_stale_flow_run

pytestmark = pytest.mark.e2e


@flow(name="stale-parent")
def parent() -> None: ...


@flow(name="stale-rollout")
def rollout() -> None: ...


@task(name="rollout-tracking")
def tracking() -> None: ...


async def _running_parent_and_child() -> tuple[str, str]:
    async with get_client() as client:
        parent_run = await client.create_flow_run(parent, state=Running())
        tracker = await client.create_task_run(tracking, parent_run.id, dynamic_key="0", state=Running())
        child_run = await client.create_flow_run(rollout, parent_task_run_id=tracker.id, state=Running())
        return str(parent_run.id), str(child_run.id)


async def _states(*ids: str) -> list[str]:
    async with get_client() as client:
        return [(await client.read_flow_run(i)).state.name for i in ids]  # type: ignore[union-attr]


def test_a_retry_marks_its_first_attempts_rollouts_crashed_but_not_itself(prefect_server):
    parent_id, child_id = asyncio.run(_running_parent_and_child())
    asyncio.run(crash_stale_flow_run(parent_id, current=parent_id))
    assert asyncio.run(_states(parent_id, child_id)) == ["Running", "Crashed"]


def test_a_previous_process_parent_and_rollouts_are_marked_crashed(prefect_server):
    parent_id, child_id = asyncio.run(_running_parent_and_child())
    asyncio.run(crash_stale_flow_run(parent_id, current="another-flow-run"))
    assert asyncio.run(_states(parent_id, child_id)) == ["Crashed", "Crashed"]
