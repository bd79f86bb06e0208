"""The base of every config section: frozen, no unknown keys, no inf/NaN."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # allow_inf_nan=False: `--lr inf` or `--rollout-temperature nan` is a typo, never a setting
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
