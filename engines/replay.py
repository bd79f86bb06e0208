"""Pure helpers for record/replay: dump-path templates, replay subsampling, the injection guard.

Behaviour follows the anchors (slime / miles; reference: debug-features.md §1.4, §1.5, §2):

- Templates are expanded with ``str.format(rollout_id=str(id))``; eval rollouts use the id
  ``"eval_<id>"``. Unlike the anchors we *require* ``{rollout_id}`` (as miles' later help texts
  say): a literal path would be overwritten by every rollout without a word.
- ``subsample`` keeps a head and a tail of the flat sample list, with the anchors' quirk that a
  ratio too small to keep one sample keeps everything.
- ``check_injection`` is miles' guard for ``--ci-inject-rollout-data-path``: fresh generations
  must share the recording's prompts and mostly its responses, proving the engines got the
  right weights even though the recording is what gets trained on.
"""

from __future__ import annotations

import math
import numbers
import string
from typing import Any

from artifacts.schema import Sample

__all__ = [
    "InjectionMismatch",
    "check_injection",
    "eval_rollout_id",
    "format_template",
    "response_match_ratio",
    "subsample",
    "validate_template",
]


class InjectionMismatch(RuntimeError):
    """Freshly generated samples do not match the injected recording (see ``check_injection``)."""


# --------------------------------------------------------------------------------------------
# Path templates
# --------------------------------------------------------------------------------------------


def eval_rollout_id(rollout_id: int) -> str:
    """The id an eval rollout's dump path is formatted with: ``"eval_<id>"`` (anchors' §1.4)."""
    return f"eval_{rollout_id}"


def format_template(template: str, rollout_id: int | str) -> str:
    """``template.format(rollout_id=str(rollout_id))``: the dump path of one rollout.

    The id is passed as a string, as the anchors do, so train and eval ids (``"eval_3"``) format
    alike; a format spec such as ``{rollout_id:06d}`` therefore fails (``validate_template``
    catches it up front). Any placeholder other than ``{rollout_id}``, or a malformed template,
    raises ``ValueError`` naming the template.
    """
    try:
        return template.format(rollout_id=str(rollout_id))
    except KeyError as e:
        raise ValueError(
            f"path template {template!r} has placeholder {{{e.args[0]}}}; only {{rollout_id}} is filled in"
        ) from e
    except (IndexError, ValueError) as e:
        raise ValueError(
            f"path template {template!r} cannot be formatted with rollout_id={rollout_id!r}: {e}"
        ) from e


def validate_template(template: str, flag: str) -> None:
    """Check a dump-path template given to ``flag`` before anything runs; ``ValueError`` if bad.

    The template must contain ``{rollout_id}`` (without it the literal path would be silently
    overwritten every rollout), no other placeholder, and must format with a string id.
    """
    if not isinstance(template, str) or not template:
        raise ValueError(f"{flag}: expected a path template containing {{rollout_id}}, got {template!r}")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ValueError(f"{flag}: malformed path template {template!r}: {e}") from e
    if "rollout_id" not in fields:
        raise ValueError(
            f"{flag}: path template {template!r} has no {{rollout_id}} placeholder; a literal path would "
            "be silently overwritten every rollout. Use e.g. 'dumps/rollout_{rollout_id}.pt'"
        )
    others = sorted({name for name in fields if name != "rollout_id"})
    if others:
        raise ValueError(
            f"{flag}: path template {template!r} has placeholder(s) {others}; only {{rollout_id}} is filled in"
        )
    try:
        format_template(template, "0")
    except ValueError as e:
        raise ValueError(f"{flag}: {e} (the id is a string, e.g. '3' or 'eval_3')") from e


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
