"""Prefect tasks: the stages of a rollout (thin: resolve refs, call actors, write artifacts, return refs)."""

# The stage names (`--refresh` takes them): a light list the CLI checks before importing Prefect or Ray.
STAGE_NAMES = (
    "check",
    "eval",
    "generate",
    "inject",
    "load-rollout",
    "log-prob",
    "save-rollout",
    "sync",
    "train-step",
)
