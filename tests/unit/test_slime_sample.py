"""slime's Sample and args as a custom reward and the plug-ins receive them, the calling conventions slime uses
(a `(*args, **kwargs)` wrapper, --group-rm), and the round trip to the rollout row."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from artifacts.schema import Sample as Row
from config import RunConfig
from engines.base import GenerateOutput
from rollout.rewards import Scorer
from rollout.sample import Sample, SampleError, from_row, to_row
from rollout.scoring import finished_sample, score_samples
from rollout.slime_args import config_fields, slime_args
from rollout.template import Stops


class CharTok:
    """A tokenizer of single characters (id = code point), enough to decode."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def _pending(index: int, group: int = 0, prompt: str = "1+1=") -> Sample:
    return Sample(
        group_index=group,
        index=index,
        prompt=prompt,
        tokens=[ord(c) for c in prompt],
        label="2",
        seed=7 + index,
    )


def _finished(index: int, text: str, reason: str = "stop", group: int = 0) -> Sample:
    out = GenerateOutput(tuple(ord(c) for c in text), tuple(-0.5 for _ in text), reason, 3)
    sample, _ = finished_sample(_pending(index, group), out, CharTok(), Stops((), ()))
    return sample


def test_args_carry_every_config_field_under_slime_names():
    cfg = RunConfig(
        rollout={"rollout_max_response_len": 9, "n_samples_per_prompt": 2}, reward={"rm_type": "math"}
    )
    args = slime_args(cfg)
    assert args.rollout_max_response_len == 9 and args.n_samples_per_prompt == 2 and args.rm_type == "math"
    assert args.custom_rm_path is None and args.hf_checkpoint is None and args.rollout_global_dataset
    assert set(config_fields(cfg)) <= set(vars(args))
    assert len(config_fields(cfg)) > 100  # every section, flattened
    args.rollout_max_response_len = 1  # a plug-in's change stays in its copy
    assert slime_args(cfg).rollout_max_response_len == 9


def test_finished_sample_is_slime_shaped_and_truncation_is_said():
    done, cut = _finished(0, "2"), _finished(1, "222", reason="length")
    assert done.status is Sample.Status.COMPLETED and cut.status is Sample.Status.TRUNCATED
    assert cut.tokens == [ord(c) for c in "1+1=222"] and cut.response_length == 3 and cut.response == "222"
    assert cut.response_tokens == [ord("2")] * 3 and cut.prompt_tokens == [ord(c) for c in "1+1="]
    assert cut.loss_mask == [1, 1, 1] and cut.rollout_log_probs == [-0.5] * 3 and cut.weight_versions == ["3"]


def test_append_response_tokens_masks_tool_output():
    s = _pending(0)
    s.append_response_tokens(tokens=[50, 51], log_probs=[-1.0, -2.0], text="23")
    s.append_response_tokens(tokens=[52], trainable=False, text="4")
    s.append_response_tokens(
        tokens=[53],
        log_probs=[-3.0],
        text="5",
        meta_info={"finish_reason": {"type": "length"}, "weight_version": 4},
    )
    assert s.loss_mask == [1, 1, 0, 1] and s.rollout_log_probs == [-1.0, -2.0, 0.0, -3.0]
    assert s.response == "2345" and s.response_length == 4 and s.effective_response_length == 3
    assert s.status is Sample.Status.TRUNCATED and s.weight_versions == ["4"]
    with pytest.raises(SampleError, match="need their rollout log-probs"):
        s.append_response_tokens(tokens=[1])
    with pytest.raises(SampleError, match="take no rollout log-probs"):
        s.append_response_tokens(tokens=[1], log_probs=[0.0], trainable=False)


def test_row_round_trip_keeps_mask_status_and_tokens():
    s = _finished(0, "222", reason="length")
    s.append_response_tokens(tokens=[52], trainable=False, text="4")
    row = to_row(s, rollout_id=5, weight_version=3, reward=1.0)
    row.validate()
    assert row.status == "truncated" and row.loss_mask == [1, 1, 1, 0] and row.response_tokens[-1] == 52
    back = from_row(row)
    assert (
        back.tokens == s.tokens and back.loss_mask == s.loss_mask and back.status is Sample.Status.TRUNCATED
    )
    failed = _finished(1, "2")
    failed.status = Sample.Status.FAILED
    assert to_row(failed, 5, 3, 0.0).loss_mask == [0]
    bad = _finished(2, "22")
    bad.loss_mask = [1]
    with pytest.raises(SampleError, match="loss_mask has 1 entries but response_length is 2"):
        to_row(bad, 5, 3, 0.0)
    assert isinstance(to_row(_pending(3), 5, 3, 0.0), Row)  # a sample left PENDING trains as completed


@pytest.fixture
def plugin_rewards(tmp_path, monkeypatch):
    (tmp_path / "slimerm.py").write_text(
        textwrap.dedent("""
        import functools

        async def reads_sample(args, sample):
            assert sample.status.value in ("completed", "truncated")
            return {"score": float(sample.response == sample.label), "n": sample.response_length,
                    "max": args.rollout_max_response_len, "status": sample.status.value}

        def timed(fn):  # a decorator without functools.wraps
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper

        @timed
        async def wrapped(args, sample):
            return float(sample.response == sample.label)

        CALLS = []

        async def per_group(args, samples):
            CALLS.append([s.index for s in samples])
            right = [s.response == s.label for s in samples]
            return [float(r) / max(1, sum(right)) for r in right]

        ORDER = []

        def sync_groups(args, samples):  # stateful: sees the groups in order
            ORDER.append(samples[0].group_index)
            return [float(len(ORDER))] * len(samples)

        def group_wrong_count(args, samples):
            return [1.0]

        def group_raises(args, samples):
            raise RuntimeError("judge down")
    """)
    )
    monkeypatch.chdir(tmp_path)
    return "slimerm"


def _scorer(path: str, key: str | None = None, **settings: object) -> Scorer:
    return Scorer(None, path, key, {"rollout_max_response_len": 6, **settings}, 5.0)


def test_custom_reward_gets_slime_sample_and_full_args(plugin_rewards):
    samples = [_finished(0, "2"), _finished(1, "222", reason="length")]
    scored = asyncio.run(score_samples(_scorer(f"{plugin_rewards}.reads_sample", "score"), samples))
    assert [s.reward for s in scored] == [1.0, 0.0]
    assert scored[0].extra == {"n": 1, "max": 6, "status": "completed"}
    assert scored[1].extra == {"n": 3, "max": 6, "status": "truncated"}


def test_star_args_reward_is_called_as_slime_calls_it(plugin_rewards):
    scored = asyncio.run(
        score_samples(_scorer(f"{plugin_rewards}.wrapped"), [_finished(0, "2"), _finished(1, "3")])
    )
    assert [s.reward for s in scored] == [1.0, 0.0]


def test_group_rm_calls_once_per_group(plugin_rewards):
    import slimerm  # type: ignore[import-not-found]

    samples = [_finished(i, t, group=i // 2) for i, t in enumerate(["2", "2", "2", "5"])]
    scored = asyncio.run(score_samples(_scorer(f"{plugin_rewards}.per_group"), samples, group_rm=True))
    assert sorted(slimerm.CALLS) == [[0, 1], [2, 3]]
    assert [s.reward for s in scored] == [0.5, 0.5, 1.0, 0.0]
    three = [_finished(i, "2", group=i // 2) for i in range(6)]
    ordered = asyncio.run(score_samples(_scorer(f"{plugin_rewards}.sync_groups"), three, group_rm=True))
    assert slimerm.ORDER == [0, 1, 2] and [s.reward for s in ordered] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    failed = asyncio.run(score_samples(_scorer(f"{plugin_rewards}.group_raises"), samples[:2], group_rm=True))
    assert all(s.error == "RuntimeError: judge down" for s in failed)
    with pytest.raises(ValueError, match="returned list of 1 for group 0 of 2 samples"):
        asyncio.run(score_samples(_scorer(f"{plugin_rewards}.group_wrong_count"), samples[:2], group_rm=True))


def test_a_reward_set_by_the_generate_function_is_kept(plugin_rewards):
    s = _finished(0, "9")
    s.reward = 0.25
    scored = asyncio.run(score_samples(_scorer(f"{plugin_rewards}.wrapped"), [s, _finished(1, "2")]))
    assert [x.reward for x in scored] == [0.25, 1.0]
