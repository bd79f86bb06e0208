"""Serving and scheduling helpers for prefect.yaml and `rollflow serve`."""
