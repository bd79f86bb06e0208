"""Pure helpers for record/replay: replay subsampling and the injection guard.

Behaviour follows the anchors (slime / miles; reference: debug-features.md §1.4, §1.5, §2):

- ``subsample`` keeps a head and a tail of the flat sample list, with the anchors' quirk that a
  ratio too small to keep one sample keeps everything.
- ``check_injection`` is miles' guard for ``--ci-inject-rollout-data-path``: fresh generations
  must share the recording's prompts and mostly its responses, proving the engines got the
  right weights even though the recording is what gets trained on.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from artifacts.schema import Sample

__all__ = [
    "InjectionMismatch",
    "check_injection",
    "response_match_ratio",
    "subsample",
]


class InjectionMismatch(RuntimeError):
    """Freshly generated samples do not match the injected recording (see ``check_injection``)."""


# --------------------------------------------------------------------------------------------
# Replay subsampling (--load-debug-rollout-data-subsample)
# --------------------------------------------------------------------------------------------


def subsample(samples: list[Sample], ratio: float) -> list[Sample]:
    """Keep about ``ratio`` of the loaded samples: a head and a tail of the flat list.

    Exactly the anchors' rule: ``rough = int(len(samples) * ratio)``; keep
    ``samples[: rough // 2] + samples[-rough // 2 :]``, i.e. ``floor(rough / 2)`` from the head
    and ``ceil(rough / 2)`` from the tail (Python floors the negated count), in list order. Like
    the anchors it slices the flat list, not whole prompt groups, so the groups at the cut may
    arrive incomplete.

    Quirk kept on purpose (so rollflow replays the same samples as slime would): when
    ``rough == 0`` (``ratio < 1 / len(samples)``), the second slice is ``samples[0:]`` and
    EVERYTHING is kept, not nothing.

    ``ratio`` must satisfy ``0 < ratio <= 1``; otherwise ``ValueError``.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1:
        raise ValueError(
            f"--load-debug-rollout-data-subsample must be a number in (0, 1] (the fraction of loaded "
            f"samples to keep), got {ratio!r}"
        )
    rough = int(len(samples) * ratio)
    return samples[: rough // 2] + samples[-rough // 2 :]


# --------------------------------------------------------------------------------------------
# Injection guard (--ci-inject-rollout-data-*)
# --------------------------------------------------------------------------------------------


def response_match_ratio(a: list[int], b: list[int]) -> float:
    """Positional agreement of two responses: ``#{i < min(len): a[i] == b[i]} / max(len)``.

    Not a common prefix: a single flipped token costs one position. Two empty responses match
    fully (1.0); one empty against one non-empty gives 0.0.
    """
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return sum(x == y for x, y in zip(a, b, strict=False)) / longest


def _by_index(samples: list[Sample], which: str) -> dict[int, Sample]:
    out: dict[int, Sample] = {}
    for s in samples:
        if s.sample_index in out:
            raise InjectionMismatch(f"{which} samples hold sample_index {s.sample_index} twice")
        out[s.sample_index] = s
    return out


def check_injection(fresh: list[Sample], recorded: list[Sample], min_ratio: float) -> dict[str, Any]:
    """Guard an injected recording: ``fresh`` (generated now) against ``recorded`` (injected).

    Samples are paired by ``sample_index``; both sides must hold the same indices. Prompt tokens
    must be identical (else a wiring error: ``InjectionMismatch`` naming the first differing
    sample index). Then the per-sample ``response_match_ratio`` of the response tokens is
    averaged; unless ``mean > min_ratio`` (strict, as miles) ``InjectionMismatch`` is raised.
    Returns ``{"mean_match_ratio", "min_match_ratio" (the worst sample), "num_samples"}``.
    ``min_ratio`` must be in [0, 1) (a strict bound of 1 could never pass); miles' default is 0.9.
    """
    if isinstance(min_ratio, bool) or not isinstance(min_ratio, numbers.Real) or not 0 <= min_ratio < 1:
        raise ValueError(f"min_ratio must be a number in [0, 1), got {min_ratio!r}")
    fresh_by, recorded_by = _by_index(fresh, "fresh"), _by_index(recorded, "recorded")
    if fresh_by.keys() != recorded_by.keys():
        only_fresh = sorted(fresh_by.keys() - recorded_by.keys())
        only_recorded = sorted(recorded_by.keys() - fresh_by.keys())
        raise InjectionMismatch(
            f"sample count mismatch: {len(fresh)} generated vs {len(recorded)} recorded; sample indices only "
            f"generated: {only_fresh[:10]}, only recorded: {only_recorded[:10]} (wrong recording for this rollout?)"
        )
    if not fresh_by:
        raise InjectionMismatch("no samples to compare: the guard cannot vouch for the engines' weights")

    ratios = []
    for index in sorted(fresh_by):
        new, old = fresh_by[index], recorded_by[index]
        if new.prompt_tokens != old.prompt_tokens:
            raise InjectionMismatch(
                f"prompt tokens mismatch at sample_index {index}: generated from {len(new.prompt_tokens)} "
                f"prompt tokens, recorded with {len(old.prompt_tokens)}; the recording is not of these "
                "prompts (wrong rollout id, data order or tokenizer)"
            )
        ratios.append(response_match_ratio(new.response_tokens, old.response_tokens))

    mean = math.fsum(ratios) / len(ratios)
    result = {"mean_match_ratio": mean, "min_match_ratio": min(ratios), "num_samples": len(ratios)}
    if not mean > min_ratio:
        raise InjectionMismatch(
            f"generated responses match the injected recording at only {mean:.4f} on average (worst sample "
            f"{min(ratios):.4f}, {len(ratios)} samples), not above the threshold {min_ratio}; the engines "
            "probably hold wrong weights: the weight sync is broken or was skipped"
        )
    return result
