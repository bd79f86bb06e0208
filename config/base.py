"""The base of every config section: frozen, no unknown keys, no inf/NaN."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# numpy's legacy seeder takes 32 bits, and Megatron adds per-rank offsets before torch's 64-bit seeder
SEED_MAX = 2**32 - 1


class Section(BaseModel):
    # allow_inf_nan=False: `--lr inf` or `--rollout-temperature nan` is a typo, never a setting
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
