"""Record/replay helpers: subsample rule, response match ratio, injection guard (templates: test_debug_config)."""

from __future__ import annotations

import dataclasses

import pytest

from artifacts import Sample
from rollout.replay import (
    InjectionMismatch,
    check_injection,
    response_match_ratio,
    subsample,
)


def _sample(index: int, response: list[int], prompt: list[int] | None = None) -> Sample:
    return Sample(
        rollout_id=0,
        group_index=index // 2,
        sample_index=index,
        prompt="p",
        prompt_tokens=prompt if prompt is not None else [2, index, 3],
        response="r",
        response_tokens=response,
        response_length=len(response),
        label="",
        reward=0.0,
        status="completed",
        loss_mask=[1] * len(response),
        rollout_log_probs=[],
        weight_version=0,
        seed=index,
    )


# --------------------------------------------------------------------------------------------
# subsample
# --------------------------------------------------------------------------------------------


def _indices(samples: list[Sample]) -> list[int]:
    return [s.sample_index for s in samples]


@pytest.mark.parametrize(
    ("n", "ratio", "expected"),
    [
        (10, 0.5, [0, 1, 7, 8, 9]),  # rough 5: 2 from the head, ceil(5/2) = 3 from the tail
        (10, 0.4, [0, 1, 8, 9]),
        (10, 0.1, [9]),  # rough 1: nothing from the head, one from the tail
        (10, 1.0, list(range(10))),
        (10, 0.3, [0, 8, 9]),  # 10 * 0.3 == 3.0000000000000004 -> rough 3
        (10, 0.09, list(range(10))),  # rough 0 -> samples[:0] + samples[0:]: everything (anchors' quirk)
        (3, 0.2, [0, 1, 2]),  # rough 0 again
        (0, 0.5, []),
    ],
)
def test_subsample_keeps_head_and_tail(n: int, ratio: float, expected: list[int]) -> None:
    samples = [_sample(i, [1]) for i in range(n)]
    kept = subsample(samples, ratio)
    assert _indices(kept) == expected
    # the anchors' expression, verbatim, as the oracle
    rough = int(n * ratio)
    assert _indices(kept) == _indices(samples[: rough // 2] + samples[-rough // 2 :])


@pytest.mark.parametrize("ratio", [0, 0.0, -0.5, 1.01, 2, float("nan"), float("inf"), True, "0.5", None])
def test_subsample_rejects_ratios_outside_0_1(ratio: object) -> None:
    with pytest.raises(ValueError, match=r"--load-debug-rollout-data-subsample must be a number in \(0, 1\]"):
        subsample([_sample(0, [1])], ratio)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# response_match_ratio
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([5, 6, 7, 8], [5, 6, 7, 8], 1.0),
        ([5, 6, 7, 8], [5, 9, 7, 8], 0.75),  # one flipped token costs one position, not the rest
        ([5, 6], [5, 6, 7, 8], 0.5),  # over the longer length
        ([5, 6, 7, 8], [5, 6], 0.5),
        ([1, 2, 3], [2, 3, 4], 0.0),  # positional, not alignment: a shift matches nothing
        ([], [], 1.0),
        ([], [1], 0.0),
    ],
)
def test_response_match_ratio(a: list[int], b: list[int], expected: float) -> None:
    assert response_match_ratio(a, b) == expected


# --------------------------------------------------------------------------------------------
# check_injection
# --------------------------------------------------------------------------------------------


def test_check_injection_passes_and_reports() -> None:
    recorded = [_sample(0, [5, 6, 7, 8]), _sample(1, [1, 2]), _sample(2, [])]
    fresh = [_sample(2, []), _sample(1, [1, 2]), _sample(0, [5, 6, 7, 9])]  # any order: paired by index
    result = check_injection(fresh, recorded, min_ratio=0.9)
    assert result == {"mean_match_ratio": pytest.approx(2.75 / 3), "min_match_ratio": 0.75, "num_samples": 3}


def test_check_injection_threshold_is_strict() -> None:
    recorded = [_sample(0, [5, 6, 7, 8])]
    fresh = [_sample(0, [5, 6, 0, 0])]
    assert check_injection(fresh, recorded, min_ratio=0.49)["mean_match_ratio"] == 0.5
    with pytest.raises(InjectionMismatch) as info:
        check_injection(fresh, recorded, min_ratio=0.5)  # mean == threshold fails, as in miles
    message = str(info.value)
    assert "0.5000" in message and "threshold 0.5" in message
    assert "the engines probably hold wrong weights: the weight sync is broken or was skipped" in message


def test_check_injection_prompt_mismatch_names_first_index() -> None:
    recorded = [_sample(i, [1]) for i in range(4)]
    fresh = [_sample(0, [1]), _sample(1, [1]), _sample(2, [1], prompt=[9]), _sample(3, [1], prompt=[9])]
    with pytest.raises(InjectionMismatch, match="prompt tokens mismatch at sample_index 2") as info:
        check_injection(fresh, recorded, min_ratio=0.0)
    message = str(info.value)
    assert message.startswith("prompt tokens differ (responses were not compared)")
    assert "(2 of 4 samples), generated vs recorded at position 0: 9 vs 2" in message
    # same text, other ids: the tokenizer or template is the first suspect, the data order the second
    assert "the prompt text is the same, only its token ids differ" in message
    assert message.index("(1) the tokenizer or chat template changed") < message.index("(2) the prompt data")
    assert "weights" not in message


def test_check_injection_prompt_mismatch_ranks_causes_by_the_evidence() -> None:
    recorded = [_sample(0, [1])]
    other_text = [dataclasses.replace(recorded[0], prompt="q", prompt_tokens=[2, 0, 4])]
    with pytest.raises(InjectionMismatch) as info:
        check_injection(other_text, recorded, min_ratio=0.0)
    assert "(1) the prompt data or its order changed" in str(info.value)
    assert "the prompt text differs too: 'q' vs recorded 'p'" in str(info.value)
    other_rollout = [dataclasses.replace(recorded[0], rollout_id=5, prompt_tokens=[2, 0, 4])]
    with pytest.raises(InjectionMismatch, match=r"\(1\) the recording is of rollout 0, this is rollout 5"):
        check_injection(other_rollout, recorded, min_ratio=0.0)


def test_check_injection_response_mismatch_says_prompts_agree_and_ranks_causes() -> None:
    recorded = [_sample(0, [5, 6, 7, 8]), _sample(1, [5, 6])]
    fresh = [_sample(0, [5, 9, 9, 9]), _sample(1, [5, 6])]
    with pytest.raises(InjectionMismatch) as info:
        check_injection(fresh, recorded, min_ratio=0.9)
    message = str(info.value)
    assert message.startswith("response tokens differ (prompt tokens are identical in all 2 samples)")
    assert "worst sample_index 0: 0.2500, generated vs recorded at position 1: 9 vs 6" in message
    assert message.index("(1) the engines probably hold wrong weights") < message.index(
        "(2) the recording comes"
    )
    assert "(4) numerics differ" in message
    reseeded = [dataclasses.replace(s, seed=s.seed + 100) for s in fresh]
    with pytest.raises(InjectionMismatch) as info:
        check_injection(reseeded, recorded, min_ratio=0.9)
    assert "(1) sampling differs from the recording's" in str(info.value)
    assert "sample_index 0 has seed 100, recorded 0" in str(info.value)
    stale = [dataclasses.replace(s, weight_version=0) for s in fresh]
    ahead = [dataclasses.replace(s, weight_version=3) for s in recorded]
    with pytest.raises(
        InjectionMismatch, match="they hold weight version 0, the recording was generated with version 3"
    ):
        check_injection(stale, ahead, min_ratio=0.9)


def test_check_injection_sample_sets_must_agree() -> None:
    recorded = [_sample(i, [1]) for i in range(3)]
    with pytest.raises(
        InjectionMismatch, match=r"sample count mismatch: 2 generated vs 3 recorded.*only recorded: \[2\]"
    ):
        check_injection(recorded[:2], recorded, min_ratio=0.5)
    with pytest.raises(InjectionMismatch, match="twice"):
        check_injection([*recorded, recorded[0]], recorded, min_ratio=0.5)
    with pytest.raises(InjectionMismatch, match="no samples"):
        check_injection([], [], min_ratio=0.5)


@pytest.mark.parametrize("min_ratio", [-0.1, 1.0, 1.5, float("nan")])
def test_check_injection_rejects_impossible_thresholds(min_ratio: float) -> None:
    with pytest.raises(ValueError, match="min_ratio"):
        check_injection([_sample(0, [1])], [_sample(0, [1])], min_ratio)


def test_check_injection_ignores_everything_but_tokens() -> None:
    recorded = [_sample(0, [1, 2])]
    fresh = [dataclasses.replace(recorded[0], reward=1.0, response="other", seed=99)]
    assert check_injection(fresh, recorded, 0.9)["mean_match_ratio"] == 1.0


def test_check_injection_names_the_template_first_when_the_engine_got_other_prompt_tokens() -> None:
    recorded = [_sample(0, [5, 6, 7, 8]), _sample(1, [5, 6])]
    fresh = [_sample(0, [5, 9, 9, 9]), _sample(1, [5, 6])]
    with pytest.raises(InjectionMismatch) as info:  # the trainer's tokenization gives the engine's tokens
        check_injection(fresh, recorded, 0.9, lambda texts: [s.prompt_tokens for s in fresh])
    assert "(1) the engines probably hold wrong weights" in str(info.value)
    # the planted fault: the engine side's tokenizer adds a token (id 2) that the trainer's does not
    with pytest.raises(InjectionMismatch) as info:
        check_injection(fresh, recorded, 0.9, lambda texts: [s.prompt_tokens[1:] for s in fresh])
    assert (
        "likely causes, most likely first: (1) the engines conditioned on other prompt tokens than the trainer "
        "scores: the chat template or tokenizer on the engine's side differs (sample_index 0 (2 of 2 samples), "
        "engine vs trainer at position 0: 2 vs 0; confirm with rollflow check-template --hf-checkpoint HF_DIR "
        "--prompt-data FILE); (2) sampling differs"
    ) in str(info.value)


def test_check_injection_names_the_template_first_when_the_same_row_renders_to_another_text() -> None:
    recorded = [dataclasses.replace(_sample(0, [1]), label="7")]
    rendered = [dataclasses.replace(recorded[0], prompt="<bot>p", prompt_tokens=[9, 2, 0, 3])]
    with pytest.raises(InjectionMismatch) as info:
        check_injection(rendered, recorded, min_ratio=0.0)
    assert (
        "the prompt text differs too: '<bot>p' vs recorded 'p' (the same label '7': the same row rendered "
        "otherwise); likely causes, most likely first: (1) the tokenizer or chat template changed"
    ) in str(info.value)
