"""Deployment parameters: a run of a deployment gets the served defaults, deep-merged under what it was given.

Prefect merges a flow run's parameters over its deployment's (and a schedule's) one top-level key at a
time, so a run given `{"cfg": {"rollout": {"num_rollout": 3}}}` would lose every served default of `cfg`.
The run flow calls `apply_served_defaults` when it resolves its config (`flows/resolve.py`). Inside a
deployment flow run, it reads the deployment's own `cfg` from the API and merges the given fields over it,
section by section.

Values equal to RunConfig's defaults count as not given: the UI's Run form sends every field of the form,
and presets (the recipe's data keys) apply only where the config leaves a field unset.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

from config import RunConfig


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top: nested dicts merge key by key, any other value of `over` replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _non_default(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict) and key in RunConfig.model_fields:
            section = _non_default(value, default)  # a section: keep only its changed fields
            if section:
                out[key] = section
        elif value != default:
            out[key] = value
    return out


def merge_over_defaults(defaults: dict[str, Any], cfg: RunConfig) -> RunConfig:
    """The config of a deployment run: the fields `cfg` was given (`model_fields_set`, per section) over the
    served `defaults` (a possibly partial RunConfig as JSON), with values equal to RunConfig's defaults left
    unset. ValueError (pydantic's) when the merged config is invalid."""
    given = cfg.model_dump(mode="json", exclude_unset=True)
    merged = RunConfig.model_validate(deep_merge(defaults, given)).model_dump(mode="json")
    return RunConfig.model_validate(_non_default(merged, RunConfig().model_dump(mode="json")))


def _deployment_run() -> tuple[uuid.UUID, uuid.UUID, str] | None:
    """(deployment id, flow run id, flow run name) when this code runs inside a deployment's flow run."""
    if "prefect" not in sys.modules:  # the CLI resolves its config before importing Prefect: no flow run
        return None
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    run = ctx.flow_run if ctx is not None else None
    if run is None or run.deployment_id is None:
        return None
    return run.deployment_id, run.id, run.name


def apply_served_defaults(cfg: RunConfig) -> RunConfig:
    """Inside a deployment's flow run: `merge_over_defaults` of the deployment's `cfg` parameter, and the flow
    run renamed `run/<name>` when the merged name differs from the one Prefect named it by. Elsewhere: `cfg`."""
    found = _deployment_run()
    if found is None:
        return cfg
    deployment_id, flow_run_id, run_name = found
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        defaults = client.read_deployment(deployment_id).parameters.get("cfg") or {}
        merged = merge_over_defaults(defaults, cfg)
        if run_name != f"run/{merged.name}":
            client.update_flow_run(flow_run_id, name=f"run/{merged.name}")
    return merged
