"""Prefect tasks, thin: resolve refs, call actors, write artifacts, return refs."""
