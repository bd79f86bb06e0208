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


def preload_arrow() -> None:
    """Import now what pyarrow imports lazily, in a process that reads or writes artifacts.

    pyarrow imports pandas and its compute module at the first array it builds from Python objects, 0.4-0.8 s on
    these CPUs, which the first artifact write or read paid on the first rollout's path (the rollout actor, the
    trainer and the driver, one after another). Done at set-up, before `freeze_heap`, the modules are frozen with
    the rest of the heap."""
    import pyarrow as pa

    pa.table({"x": pa.array([0], pa.int32())}).cast(pa.schema([("x", pa.int64())]))
