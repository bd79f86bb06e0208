"""Small refs passed between tasks (besides `artifacts.store.ArtifactRef`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WeightsRef(BaseModel):
    """The weights the engines hold: version (= id of the last rollout trained + 1) and identity."""

    model_config = ConfigDict(frozen=True)
    version: int
    sha256: str
