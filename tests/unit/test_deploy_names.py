"""`rollflow serve` and `prefect deploy` of prefect.yaml share a server without meeting: one name on a server is one
deployment, and serving a work pool's deployment would take it from the pool's workers."""

from __future__ import annotations

from pathlib import Path

import yaml

from config import RunConfig
from deployments.serve import deployments
from flows.replay import replay_flow
from flows.run import run_flow

ROOT = Path(__file__).resolve().parents[2]
FLOWS = {"flows/run.py:run_flow": run_flow.name, "flows/replay.py:replay_flow": replay_flow.name}


def _prefect_yaml() -> set[str]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {f"{FLOWS[d['entrypoint']]}/{d['name']}" for d in spec["deployments"]}


def test_served_names_differ_from_prefect_yaml_names_whatever_the_config_is_named():
    deployed = _prefect_yaml()
    assert deployed == {"rollflow-run/tiny-arith-worker", "replay/worker"}
    # a config named after each deployment or flow, the worst case for a name built from it
    names = {"tiny-arith", "tiny-arith-scheduled"} | {n.split("/")[1] for n in deployed}
    for name in names:
        served = {f"{d.flow_name}/{d.name}" for d in deployments(RunConfig(name=name))}
        assert served == {f"rollflow-run/{name}-served", "replay/served"}
        assert not served & deployed
