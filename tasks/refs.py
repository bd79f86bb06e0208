"""Small refs passed between tasks (besides `artifacts.store.ArtifactRef`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from artifacts.store import ArtifactRef


class WeightsRef(BaseModel):
    """The weights the engines hold: version (= id of the last rollout trained + 1) and identity."""

    model_config = ConfigDict(frozen=True)
    version: int
    sha256: str
    # the weights the engines held before the sync that made this version (None: not asked): an engine still
    # holding them after the sync is stale, the transfer did not apply
    previous_sha256: str | None = None


class LogProbs(BaseModel):
    """What the log-prob stage hands on: the trainer's log-prob table and the rollout's statistics of it
    (`rollout/log_probs`, `rollout/ref_log_probs`, `rollout/entropy`, ...), which the check stage's log-prob
    checker reads by value instead of from metrics.jsonl."""

    model_config = ConfigDict(frozen=True)
    table: ArtifactRef
    stats: dict[str, float]
