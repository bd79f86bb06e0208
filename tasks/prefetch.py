"""The next rollout's generation, started on the engines by the parent flow run as soon as the body of the
`rollout-<id>` flow run before it returns (its weights synced and checked), so that the engines generate while
Prefect records that run's end and starts the next one (several API round trips on the critical path
otherwise, with the engines idle). The `generate` task of that rollout then takes the answers instead of asking
again.

Nothing about the samples changes: sampling is seeded per sample, so a request gives the same tokens whenever
it runs on the same weights. The started generation is used only by the first attempt of the generate task of
the same rollout, on the same engines, weights and requests; anything else (a retry, a cached generate, a run
that ends first) drops it. An error the engines raised surfaces in that generate task, as if it had asked
(its retry then asks afresh). `--debug-sequential-generation` turns this off.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from config import RunConfig
from engines.base import GenerateOutput, GenerateRequest
from tasks import actors


async def generate_on(
    engines: list[Any], parts: list[list[GenerateRequest]], ctx: dict[str, Any]
) -> tuple[list[list[GenerateOutput]], float]:
    """Each engine's part (empty parts skipped; one list of outputs per non-empty part, in order) and the
    seconds from the calls to the last answer."""
    began = time.perf_counter()
    outputs = await asyncio.gather(
        *[engine.generate.remote(part, ctx) for engine, part in zip(engines, parts, strict=True) if part]
    )
    return list(outputs), time.perf_counter() - began


@dataclass
class _Started:
    key: tuple[str, int, int, str]  # actor namespace, rollout id, weights version, weights sha256
    parts: list[list[GenerateRequest]]
    answers: asyncio.Future[tuple[list[list[GenerateOutput]], float]]


_started: _Started | None = None  # at most one: the next rollout's


def _key(cfg: RunConfig, rollout_id: int, version: int, sha256: str) -> tuple[str, int, int, str]:
    return (actors.namespace(cfg), rollout_id, version, sha256)


def start(
    cfg: RunConfig, rollout_id: int, version: int, sha256: str, parts: list[list[GenerateRequest]]
) -> None:
    """Ask the run's engines for `parts` (one list of requests per engine) as rollout `rollout_id`'s first
    generate attempt would, on weights (`version`, `sha256`); replaces anything started before."""
    drop()
    global _started
    ctx = {"rollout_id": rollout_id, "attempt": 0}  # what the generate task's fault hooks would see
    answers = asyncio.ensure_future(generate_on(actors.engines(cfg), parts, ctx))
    _started = _Started(_key(cfg, rollout_id, version, sha256), parts, answers)


def take(
    cfg: RunConfig, rollout_id: int, version: int, sha256: str, parts: list[list[GenerateRequest]]
) -> asyncio.Future[tuple[list[list[GenerateOutput]], float]] | None:
    """The answers started for exactly this rollout, weights and requests (None otherwise); each start is
    taken at most once."""
    global _started
    started, _started = _started, None
    if started is None:
        return None
    if started.key != _key(cfg, rollout_id, version, sha256) or started.parts != parts:
        _discard(started)
        return None
    return started.answers


def drop() -> None:
    """Forget a started generation nobody took (the engines finish it; its answers are ignored)."""
    global _started
    if _started is not None:
        _discard(_started)
        _started = None


def _discard(started: _Started) -> None:
    if started.answers.done():
        if not started.answers.cancelled():
            started.answers.exception()  # retrieved: an engine error here belongs to no stage
    else:
        started.answers.cancel()
