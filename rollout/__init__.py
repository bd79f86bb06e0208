"""Orchestrator-side rollout: prompt data, request building and seeds, rewards, stop conditions, the
chat-template check, and the inject/subsample rules of record/replay.

Nothing here holds a model. Engines (engines/) turn requests into tokens; this package decides what to
ask and how to score the answers. It runs in the orchestrating process (the Prefect tasks) and in the run's
rollout actor (rollout/actor.py), never inside an engine.
"""
