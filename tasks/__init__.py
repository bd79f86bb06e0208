"""Prefect tasks: the stages of a rollout (thin: resolve refs, call actors, write artifacts, return refs)."""
