"""flows/children.py without a server: the engine's rewrite of a run made ahead (its flow version and retry policy,
exactly as created) is skipped, once; every other flow-run update still goes to the server."""

from __future__ import annotations

import asyncio
import uuid

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRunPolicy

from flows import children


def test_only_the_engines_unchanged_rewrite_of_a_run_made_ahead_is_skipped(monkeypatch):
    sent: list[dict] = []

    async def server(self, flow_run_id, *args, **kwargs):
        sent.append(kwargs)
        return "sent"

    monkeypatch.setattr(PrefectClient, "update_flow_run", server)
    children._skip_rewrites_of_runs_made_ahead()
    ahead, other, policy = uuid.uuid4(), uuid.uuid4(), FlowRunPolicy(retries=None, retry_delay=0)
    monkeypatch.setitem(children._CREATED, ahead, ("v1", policy.model_dump()))

    def update(run_id, **kwargs):
        return asyncio.run(PrefectClient.update_flow_run(None, run_id, **kwargs))  # type: ignore[arg-type]

    assert update(other, flow_version="v1", empirical_policy=policy) == "sent"  # not made ahead
    assert update(ahead, parameters={"weights": 1}) == "sent"  # another field: the run's own update
    assert update(ahead, flow_version="v1", empirical_policy=policy).status_code == 204
    assert len(sent) == 2
    assert update(ahead, flow_version="v1", empirical_policy=policy) == "sent"  # skipped once, not again
    monkeypatch.setitem(children._CREATED, ahead, ("v1", policy.model_dump()))
    assert update(ahead, flow_version="v2", empirical_policy=policy) == "sent"  # a changed value is written
    assert ahead not in children._CREATED
