"""--ci-test's re-generation check: sampling is seeded per request, so a request generated again on the same weights
gives the same tokens. On a layout-invariant engine (the embedded torch engine in float32) a few requests are
re-generated alone, in another batch layout. Otherwise (bfloat16, whose matmul kernels may round a row differently
with the batch's size) the whole call is re-generated in the same layout. Tokens are compared one by one; a
difference names the stage, the request's seed and the first differing token."""

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
    same_layout: bool = False,
) -> None:
    """Re-generate the first `REGENERATED` of `requests` together (another batch layout), or with `same_layout`
    all of them as they were batched, and compare their tokens with `outputs`; NotReproduced naming the first
    difference."""
    picked = requests if same_layout else requests[:REGENERATED]
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
