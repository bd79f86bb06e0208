"""Small helpers shared by test modules."""

from __future__ import annotations

import numpy as np


def float32_list(values: list[float]) -> list[float]:
    """Python floats holding exact float32 values, as ``tensor.tolist()`` returns them."""
    return np.asarray(values, dtype=np.float32).tolist()
