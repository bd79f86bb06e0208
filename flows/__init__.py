"""Prefect flows, run configuration and the `rollflow` CLI."""
