"""Built-in rewards, the custom-reward loader and its calling conventions, and reward failures."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time

import pytest

from rollout.extensions import ExtensionError, load_function
from rollout.rewards import (
    RewardRequest,
    Scorer,
    builtin_reward,
    exact_match,
    label_problem,
    probe_response,
)
from rollout.rm_hub.mathd import boxed_answer


def _req(response: str, label: object = "4", index: int = 0, metadata: dict | None = None) -> RewardRequest:
    return RewardRequest(
        prompt="What is 2+2?", response=response, label=label, metadata=metadata or {}, sample_index=index
    )


def test_exact_match_strips_whitespace_only():
    assert exact_match("  Paris\n", "Paris") == 1.0
    assert exact_match("paris", "Paris") == 0.0
    assert exact_match("12", 12) == 1.0


def test_boxed_answer_balances_braces_as_slime_does():
    assert boxed_answer("a \\boxed{1} b \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert boxed_answer("none") is None and boxed_answer("\\boxed{open") is None
    assert boxed_answer("\\fbox{3}") is None and boxed_answer("\\boxed 3 {x}") is None  # slime's: not answers


def test_f1_and_boxed_prefix():
    f1 = builtin_reward("f1")
    assert f1("the cat sat", "the cat") == pytest.approx(2 / 3)  # SQuAD drops the articles
    assert f1("", "x") == 0.0
    boxed = builtin_reward("boxed_exact_match")
    assert boxed("work... \\boxed{Paris}", "Paris") == 1.0 and boxed("Paris", "Paris") == 0.0


def test_deepscaler_scores_only_the_boxed_answer_after_the_reasoning():
    rule = builtin_reward("deepscaler")
    assert rule("<think>maybe \\boxed{3}</think> so \\boxed{4}", "4") == 1.0
    assert rule("<think>\\boxed{4}</think> I think 4", "4") == 0.0  # no boxed answer after the reasoning
    assert rule("\\boxed{4}", "4") == 0.0  # no reasoning marker at all
    assert rule("###Response the answer is \\boxed{0.5}", "1/2") == 1.0


def test_tiny_arith_rule_is_registered():
    rule = builtin_reward("tiny-arith")
    assert rule("68<eos>", "68") == 1.0 and rule("69", "68") == 0.0


def test_unknown_rm_type_and_missing_reward_are_named():
    with pytest.raises(ValueError, match="--rm-type 'nope': unknown; built-ins are"):
        builtin_reward("nope")
    with pytest.raises(ValueError, match="no reward: give --rm-type"):
        Scorer(None, None, None)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A reward module in a temp dir outside the package, importable as slime loads it (working directory)."""
    (tmp_path / "myrewards.py").write_text(
        textwrap.dedent("""
        import asyncio

        def by_keywords(response, label):
            return float(response.strip() == label)

        async def slime_style(args, sample):
            await asyncio.sleep(0)
            return {"score": 1.0 if sample.response == sample.label else 0.0, "why": sample.metadata.get("src")}

        def raises_on_seven(response, label, metadata):
            if "7" in response:
                raise RuntimeError("judge unavailable")
            return 1.0

        def returns_text(response, label):
            return "yes"

        async def async_raises_on_seven(response, label):
            await asyncio.sleep(0)
            if "7" in response:
                raise RuntimeError("judge timed out")
            return 1.0

        STARTED = []

        async def waits_for_three(response, label):  # returns once three calls are in flight together
            STARTED.append(response)
            while len(STARTED) < 3:
                await asyncio.sleep(0)
            return 1.0

        import threading
        import time

        def hangs_on_seven(response, label):  # a judge that never answers, for one sample
            if "7" in response:
                time.sleep(30)
            return float(response.strip() == label)

        async def async_hangs_on_seven(response, label):
            if "7" in response:
                await asyncio.sleep(30)
            return 1.0

        CALLS = []

        def counts_calls(response, label):  # stateful: sees the calls in order
            CALLS.append(response)
            return float(len(CALLS))

        def on_main_thread(response, label):
            return float(threading.current_thread() is threading.main_thread())

        NOT_CALLABLE = 3
    """)
    )
    monkeypatch.chdir(tmp_path)
    yield "myrewards"


def test_custom_reward_conventions(reward_module):
    kw = Scorer(None, f"{reward_module}.by_keywords", None)
    assert [s.reward for s in asyncio.run(kw.score([_req("4"), _req("5")]))] == [1.0, 0.0]
    slime = Scorer(None, f"{reward_module}.slime_style", "score")
    out = asyncio.run(slime.score([_req("4", metadata={"src": "gsm8k"})]))
    assert out[0].reward == 1.0 and out[0].extra == {"why": "gsm8k"}
    with pytest.raises(ValueError, match="returned a dict for sample 0 .* --reward-key"):
        asyncio.run(Scorer(None, f"{reward_module}.slime_style", None).score([_req("4")]))


def test_a_reward_that_raises_fails_its_sample_only(reward_module):
    out = asyncio.run(
        Scorer(None, f"{reward_module}.raises_on_seven", None).score([_req("4"), _req("7", index=1)])
    )
    assert out[0].reward == 1.0 and out[0].error is None
    assert out[1].reward == 0.0 and out[1].error == "RuntimeError: judge unavailable"


def test_async_rewards_run_concurrently_and_a_failure_fails_its_sample_only(reward_module):
    scorer = Scorer(None, f"{reward_module}.async_raises_on_seven", None)
    out = asyncio.run(scorer.score([_req("4"), _req("7", index=1), _req("5", index=2)]))
    assert [(s.reward, s.error) for s in out] == [
        (1.0, None),
        (0.0, "RuntimeError: judge timed out"),
        (1.0, None),
    ]
    together = Scorer(None, f"{reward_module}.waits_for_three", None)
    requests = [_req(str(i), index=i) for i in range(3)]
    out = asyncio.run(asyncio.wait_for(together.score(requests), timeout=10))
    assert [s.reward for s in out] == [1.0, 1.0, 1.0]


def test_a_reward_that_returns_a_non_number_names_the_sample(reward_module):
    with pytest.raises(ValueError, match=r"returned 'yes' \(str\) for sample 3"):
        asyncio.run(Scorer(None, f"{reward_module}.returns_text", None).score([_req("4", index=3)]))


@pytest.mark.parametrize(
    "path, needle",
    [
        ("nodots", "expected a dotted path"),
        ("no_such_module_xyz.fn", "cannot import 'no_such_module_xyz'"),
        ("myrewards.missing", "has no attribute 'missing'"),
        ("myrewards.NOT_CALLABLE", "is a int, not a function"),
    ],
)
def test_custom_rm_path_errors(reward_module, path, needle):
    with pytest.raises(ExtensionError, match=needle):
        load_function(path, "--custom-rm-path")


@pytest.mark.parametrize("fn", ["hangs_on_seven", "async_hangs_on_seven"])
def test_a_reward_past_rm_timeout_fails_its_sample_is_named_and_the_next_samples_score(
    reward_module, caplog, fn
):
    scorer = Scorer(None, f"{reward_module}.{fn}", None, timeout=0.5)
    requests = [_req("4"), _req("7", index=1), _req("4", index=2), _req("7", index=3), _req("4", index=4)]
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rollout.rewards"):
        out = asyncio.run(scorer.score(requests))
    assert time.monotonic() - began < 5  # two abandoned calls, not two 30 s sleeps
    assert [s.reward for s in out] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [s.error is None for s in out] == [True, False, True, False, True]
    assert out[1].error is not None and out[1].error.startswith("RewardTimeout: reward myrewards.")
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        f"reward myrewards.{fn} did not return within 0.5 s (--rm-timeout) for sample {i}: call abandoned, "
        "sample marked failed"
        for i in (1, 3)
    ]


def test_rewards_in_time_score_the_same_with_and_without_rm_timeout(reward_module):
    """The worker thread changes nothing when rewards return in time: same values, same call order."""
    requests = [_req(str(i), index=i) for i in range(6)]
    outs = []
    for timeout in (None, 0.5):
        module = __import__(reward_module)
        module.CALLS.clear()
        outs.append(
            asyncio.run(Scorer(None, f"{reward_module}.counts_calls", None, timeout=timeout).score(requests))
        )
        assert module.CALLS == [str(i) for i in range(6)]
    assert outs[0] == outs[1] and [s.reward for s in outs[0]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_no_rm_timeout_calls_the_reward_on_the_callers_thread(reward_module):
    inline = Scorer(None, f"{reward_module}.on_main_thread", None, timeout=None)
    assert [s.reward for s in asyncio.run(inline.score([_req("4")]))] == [1.0]
    bounded = Scorer(None, f"{reward_module}.on_main_thread", None, timeout=0.5)
    assert [s.reward for s in asyncio.run(bounded.score([_req("4")]))] == [0.0]


@pytest.mark.parametrize(
    "rm_type, label, ok",
    [
        ("math", "3", True),
        ("math", 3, True),
        ("boxed_exact_match", 2.5, True),
        ("math", None, False),
        ("math", True, False),
        ("f1", ["a"], False),
        ("tiny-arith", "3", True),
        ("tiny-arith", 3, False),
        ("long-arith", {"a": 1}, False),
        ("not-a-builtin", None, True),  # a custom reward takes what it takes
    ],
)
def test_label_types_each_builtin_scores(rm_type, label, ok):
    why = label_problem(rm_type, label)
    assert (why is None) == ok
    if not ok:
        assert why is not None and f"--rm-type {rm_type} expects" in why and type(label).__name__ in why
    if ok and rm_type in ("math", "tiny-arith"):  # an accepted label really scores: the right answer gets 1
        assert builtin_reward(rm_type)(probe_response(rm_type, label), label) == 1.0
