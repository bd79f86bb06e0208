"""--ci-test's re-generation check: sampling is seeded per request and, on an engine whose sampling does not depend
on the batch layout (the embedded torch engine), a request generated again alone gives the same tokens. A few
requests of each generate call are re-generated and compared token for token; a difference names the stage, the
request's seed and the first differing token."""

from __future__ import annotations

from typing import Any

from engines.base import Engine, GenerateOutput, GenerateRequest

REGENERATED = 2  # requests of each generate call re-generated (the first ones: the earliest seeds)


class NotReproduced(AssertionError):
    """A request generated again alone, on the same weights, gave other tokens."""


def regenerate_and_compare(
    engine: Engine,
    requests: list[GenerateRequest],
    outputs: list[GenerateOutput],
    engine_index: int,
    ctx: dict[str, Any] | None = None,
) -> None:
    """Re-generate the first `REGENERATED` of `requests` together (another batch layout) and compare their tokens
    with `outputs`; NotReproduced naming the first difference."""
    picked = requests[:REGENERATED]
    if not picked:
        return
    rollout = (ctx or {}).get("rollout_id")
    for i, (request, first, again) in enumerate(zip(picked, outputs, engine.generate(picked), strict=False)):
        a, b = again.response_tokens, first.response_tokens
        if a == b:
            continue
        t = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise NotReproduced(
            f"generate is not deterministic: re-generating request {i} (seed {request.seed}) of rollout {rollout} "
            f"on engine {engine_index} with the same weights gave response token {t} = {_token(a, t)} vs "
            f"{_token(b, t)}"
        )


def _token(tokens: tuple[int, ...], t: int) -> str:
    return str(tokens[t]) if t < len(tokens) else "the end"
