"""What a long-lived rollflow process (the run's driver, an engine or trainer actor) does to itself once it is
set up. A bottom package: it imports no other rollflow package."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Collect once, then move every object alive now to the GC's permanent generation.

    A set-up process holds hundreds of thousands of objects that live as long as it does (modules, classes, the
    config, a model's parameters and their Python wrappers: about 750k in the driver once Prefect, Ray, torch and
    pydantic are imported and the actors started). Each full (gen-2) collection walked them all, 200-400 ms at a
    time in the driver, a stall inside some rollout every few rollouts; frozen objects are never scanned again.
    What the process allocates later is collected as usual."""
    gc.collect()
    gc.freeze()
