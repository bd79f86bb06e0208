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
from collections.abc import Callable
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


def check_injection(
    fresh: list[Sample],
    recorded: list[Sample],
    min_ratio: float,
    encode: Callable[[list[str]], list[list[int]]] | None = None,
) -> dict[str, Any]:
    """Guard an injected recording: ``fresh`` (generated now) against ``recorded`` (injected).

    Samples are paired by ``sample_index``; both sides must hold the same indices. Prompt tokens must be
    identical. Else ``InjectionMismatch`` says that the prompts differ, naming the first differing sample
    index and token, with the likely causes in order. Then the per-sample ``response_match_ratio`` of the
    response tokens is averaged. Unless ``mean > min_ratio`` (strict, as miles), ``InjectionMismatch`` says
    that the responses differ, naming the worst sample and its first differing token, with the likely causes
    in order. The order follows the evidence: differing seeds or weight versions move their cause first.
    `encode` is the trainer's tokenization of prompt texts; engine prompt tokens it does not reproduce move
    the template and tokenizer first.
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
    pairs = [(fresh_by[i], recorded_by[i]) for i in sorted(fresh_by)]
    wrong_prompts = [(new, old) for new, old in pairs if new.prompt_tokens != old.prompt_tokens]
    if wrong_prompts:
        raise InjectionMismatch(_prompts_differ(wrong_prompts, len(pairs)))

    ratios = [response_match_ratio(new.response_tokens, old.response_tokens) for new, old in pairs]
    mean = math.fsum(ratios) / len(ratios)
    result = {"mean_match_ratio": mean, "min_match_ratio": min(ratios), "num_samples": len(ratios)}
    if not mean > min_ratio:
        raise InjectionMismatch(
            _responses_differ(pairs, ratios, mean, min_ratio, _retokenized(pairs, encode))
        )
    return result


def _first_difference(a: list[int], b: list[int]) -> str:
    """Where two token lists first differ: `position 3: 17 vs 12`, or where one ends."""
    for pos, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"position {pos}: {x} vs {y}"
    return f"position {min(len(a), len(b))}: one ends ({len(a)} vs {len(b)} tokens)"


def _causes(ranked: list[str]) -> str:
    return "likely causes, most likely first: " + "; ".join(
        f"({i}) {c}" for i, c in enumerate(ranked, start=1)
    )


def _prompts_differ(wrong: list[tuple[Sample, Sample]], total: int) -> str:
    """Prompt tokens differ: which sample and token, whether the prompt text differs too, and the causes
    ranked by that evidence. A recording of another rollout id comes first. Same text points at the tokenizer
    or template; other text at the data or its order."""
    new, old = wrong[0]
    same_text = new.prompt == old.prompt
    rollout = (
        f"the recording is of rollout {old.rollout_id}, this is rollout {new.rollout_id}: the "
        "--ci-inject-rollout-data-path template or --ci-inject-rollout-data-start-rollout-id points at "
        "another rollout"
    )
    data = (
        "the prompt data or its order changed since the recording (--prompt-data, --rollout-shuffle, "
        "--rollout-seed, --rollout-batch-size)"
    )
    tokenizer = (
        "the tokenizer or chat template changed since the recording (--hf-checkpoint, "
        "--apply-chat-template, --apply-chat-template-kwargs)"
    )
    # the same non-empty label with another text: the same row, rendered otherwise (the template)
    same_row = not same_text and bool(old.label) and new.label == old.label
    ranked = [tokenizer, data] if same_text or same_row else [data, tokenizer]
    if new.rollout_id != old.rollout_id:
        ranked.insert(0, rollout)
    text = (
        "the prompt text is the same, only its token ids differ"
        if same_text
        else f"the prompt text differs too: {new.prompt[:60]!r} vs recorded {old.prompt[:60]!r}"
        + (f" (the same label {old.label[:20]!r}: the same row rendered otherwise)" if same_row else "")
    )
    return (
        f"prompt tokens differ (responses were not compared): prompt tokens mismatch at sample_index "
        f"{new.sample_index} ({len(wrong)} of {total} samples), generated vs recorded at "
        f"{_first_difference(new.prompt_tokens, old.prompt_tokens)}; {text}; {_causes(ranked)}"
    )


def _retokenized(
    pairs: list[tuple[Sample, Sample]], encode: Callable[[list[str]], list[list[int]]] | None
) -> str:
    """Where the prompt tokens the engines were given differ from the trainer's tokenization of the prompt text
    (the first such sample and token, and how many), '' when they agree or `encode` is None."""
    if encode is None:
        return ""
    fresh = [new for new, _ in pairs]
    wrong = [
        (s, list(ids))
        for s, ids in zip(fresh, encode([s.prompt for s in fresh]), strict=True)
        if list(ids) != s.prompt_tokens
    ]
    if not wrong:
        return ""
    s, ids = wrong[0]
    return (
        f"sample_index {s.sample_index} ({len(wrong)} of {len(fresh)} samples), engine vs trainer at "
        f"{_first_difference(s.prompt_tokens, ids)}"
    )


def _responses_differ(
    pairs: list[tuple[Sample, Sample]],
    ratios: list[float],
    mean: float,
    min_ratio: float,
    retokenized: str = "",
) -> str:
    """Response tokens differ while prompts agree: the ratio, the worst sample and its first differing token,
    and the causes ranked by the evidence the samples carry (seeds, weight versions)."""
    worst = min(range(len(ratios)), key=lambda i: ratios[i])
    new, old = pairs[worst]
    seeds = next(((n, o) for n, o in pairs if n.seed != o.seed), None)
    weights = (
        "the engines probably hold wrong weights: the weight sync is broken or was skipped "
        "(--debug-skip-weight-update, --ci-fault-drop-weight; confirm with --check-weight-update-equal)"
    )
    if new.weight_version < old.weight_version:
        weights += (
            f"; they hold weight version {new.weight_version}, the recording was generated with "
            f"version {old.weight_version}"
        )
    sampling = (
        "sampling differs from the recording's (--rollout-seed, --rollout-temperature, --rollout-top-p, "
        "--rollout-top-k, --rollout-max-response-len)"
    )
    if seeds is not None:
        sampling += (
            f"; sample_index {seeds[0].sample_index} has seed {seeds[0].seed}, recorded {seeds[1].seed}"
        )
    origin = "the recording comes from another run or another point of this one (other weights: --hf-checkpoint, --load)"
    if new.weight_version > old.weight_version:
        origin += f"; it was generated with weight version {old.weight_version}, the engines hold {new.weight_version}"
    numerics = (
        "numerics differ from the recording's (engine backend, --num-threads, device): one flipped "
        "token changes the rest of a response"
    )
    template = (
        "the engines conditioned on other prompt tokens than the trainer scores: the chat template or tokenizer "
        f"on the engine's side differs ({retokenized}; confirm with rollflow check-template --hf-checkpoint "
        "HF_DIR --prompt-data FILE)"
    )
    if retokenized:
        ranked = [template, sampling, weights, origin, numerics]
    elif seeds is not None:
        ranked = [sampling, weights, origin, numerics]
    elif new.weight_version > old.weight_version:
        ranked = [origin, weights, sampling, numerics]
    else:
        ranked = [weights, origin, sampling, numerics]
    return (
        f"response tokens differ (prompt tokens are identical in all {len(pairs)} samples): generated "
        f"responses match the injected recording at only {mean:.4f} on average (worst sample_index "
        f"{new.sample_index}: {ratios[worst]:.4f}, generated vs recorded at "
        f"{_first_difference(new.response_tokens, old.response_tokens)}), not above the threshold "
        f"{min_ratio}; {_causes(ranked)}"
    )
