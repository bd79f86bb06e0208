"""Resident memory of every process of a run, read at the end of each rollout into its `perf` record: the driver
(this process), the rollout actor, each engine and each trainer rank. Names: `perf/mem_rss_gb/<process>` (now)
and `perf/mem_peak_gb/<process>` (the highest over the process's life, VmHWM), in GiB; `<process>` is `driver`,
`rollout`, `engine-<i>` or `trainer-<rank>`, and `total` sums them (the sum of peaks bounds the run's peak from
above: the processes need not peak at the same moment)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from config import RunConfig
from procs import memory_gib
from tasks import actors

RSS, PEAK = "perf/mem_rss_gb/", "perf/mem_peak_gb/"

# an actor that does not answer in this long is left out of the record: memory is observed, never waited on
_ANSWER_S = 30.0


def _handles(cfg: RunConfig) -> dict[str, Any]:
    """The run's actors by process name; an actor the run does not have (a mode without it) is left out."""
    out: dict[str, Any] = {}
    try:
        out["rollout"] = actors.rollout_actor(cfg)
    except ValueError:  # no rollout actor in this run (train-only)
        pass
    out.update({f"engine-{i}": e for i, e in enumerate(actors.engines(cfg))})
    out.update({f"trainer-{r}": t for r, t in enumerate(actors.trainers(cfg))})
    return out


def memory_metrics(per_process: dict[str, dict[str, float]]) -> dict[str, float]:
    """{process: procs.memory_gib()} -> the perf metrics: rss and peak per process, and their totals."""
    out: dict[str, float] = {}
    for name, mem in per_process.items():
        out[RSS + name] = mem["rss"]
        out[PEAK + name] = mem["peak"]
    out[RSS + "total"] = sum(m["rss"] for m in per_process.values())
    out[PEAK + "total"] = sum(m["peak"] for m in per_process.values())
    return out


async def run_memory(cfg: RunConfig) -> dict[str, float]:
    """The perf metrics of every process of `cfg`'s run (memory_metrics); an actor that is gone or slow to answer
    is logged and left out."""
    handles = _handles(cfg)
    answers = await asyncio.gather(
        *[asyncio.wait_for(h.memory.remote(), _ANSWER_S) for h in handles.values()], return_exceptions=True
    )
    per_process = {"driver": memory_gib()}
    for name, answer in zip(handles, answers, strict=True):
        if isinstance(answer, BaseException):
            logging.getLogger(__name__).warning(
                "memory of %s not read: %s: %s", name, type(answer).__name__, answer
            )
        else:
            per_process[name] = answer
    return memory_metrics(per_process)


def peaks(records: list[dict[str, Any]]) -> dict[str, float]:
    """{process: its highest `perf/mem_peak_gb/<process>`} over a run's records (the end-of-run summary)."""
    out: dict[str, float] = {}
    for r in records:
        if r.get("kind") != "perf":
            continue
        for key, value in r["metrics"].items():
            if key.startswith(PEAK):
                name = key[len(PEAK) :]
                out[name] = max(out.get(name, 0.0), float(value))
    return out
