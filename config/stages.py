"""The stages of a rollout, named once: the flow, `--refresh`, `rollflow replay`, the deployments' forms and the
stage-end fault hooks all derive from this list. Light on purpose: the CLI checks names before importing Prefect."""

from __future__ import annotations

# A rollout's stages in the order its flow run runs them (load-rollout and inject replace or follow generate
# in the debug modes that use them; eval runs after check when one is due).
STAGES: tuple[str, ...] = (
    "generate",
    "load-rollout",
    "inject",
    "save-rollout",
    "log-prob",
    "train-step",
    "sync",
    "check",
    "eval",
)

# The stages `rollflow replay --task` re-runs alone from a past rollout's recorded inputs.
REPLAYABLE: tuple[str, ...] = ("generate", "log-prob", "train-step", "sync", "check")


def stage_end_hook(stage: str) -> str:
    """The fault hook reached at the end of `stage`'s task: after its actor work and files, before its records
    are logged and it returns (e.g. `orchestrator_log_prob_end`)."""
    return f"orchestrator_{stage.replace('-', '_')}_end"


def check_stages(names: list[str], flag: str) -> None:
    """ValueError naming `flag` and the unknown names, if any of `names` is not a stage."""
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise ValueError(f"{flag}: unknown stage(s) {unknown}; stages are {sorted(STAGES)}")
