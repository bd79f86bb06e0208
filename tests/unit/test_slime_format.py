"""slime/miles ``.pt`` rollout dumps: lossless round trips, pickle refusal, real-slime-style dumps."""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from artifacts import Sample, read_metadata, read_rollout, samples_to_table, write_rollout
from artifacts.slime_format import (
    ROLLFLOW_KEY,
    SlimeFormatError,
    convert,
    load_slime_dump,
    read_any,
    save_slime_dump,
    write_any,
)
from tests.helpers import float32_list, make_sample


def _sample(index: int, n: int = 4, **changes: object) -> Sample:
    """A tiny-arith-like sample (vocab 18, chat prompt, 63-bit seed, nested metadata) in rollout 5."""
    fields: dict[str, object] = {
        "rollout_id": 5,
        "prompt": f"<|user|>{index}+1=<|assistant|>",
        "prompt_tokens": [2, 4 + index % 10, 14, 5, 16, 3],
        "seed": 2**62 + index,
        "metadata": {"finish_reason": "stop", "nested": {"k": [1, None]}},
    }
    return make_sample(index, n, vocab=18, **{**fields, **changes})


def _samples() -> list[Sample]:
    """Ordinary rows plus the awkward ones: empty response, no log-probs, odd float32s, unicode."""
    awkward = float32_list([-0.0, -math.inf, -1e-45, -3.4028234663852886e38, -1.0000001, -0.1])
    return [
        _sample(0),
        _sample(1, n=6, rollout_log_probs=awkward, loss_mask=[0, 1, 1, 0, 1, 1], prompt="Ünï 😀 中文"),
        _sample(2, n=0, prompt_tokens=[], status="aborted", metadata={}),
        _sample(3, rollout_log_probs=[], status="truncated", seed=-(2**63), weight_version=-1, reward=-0.5),
        _sample(4, status="failed", label=""),
    ]


@dataclasses.dataclass
class FakeSlimeSample:
    """Stands in for slime's ``Sample`` object pickled into old dumps (needs arbitrary unpickling)."""

    index: int
    group_index: int
    tokens: list[int]
    response_length: int
    reward: float
    status: str
    prompt: str = ""
    response: str = ""


class FakeStatus(enum.Enum):
    """Stands in for slime's ``Sample.Status``."""

    COMPLETED = "completed"
    PENDING = "pending"


def _real_slime_dict(index: int, **changes: object) -> dict:
    """A sample dict as slime's ``Sample.to_dict()`` writes it (more keys than we use)."""
    d = {
        "group_index": index // 2,
        "index": index,
        "rollout_id": None,
        "prompt": "What is 2+3?",
        "tokens": [101, 102, 103, 104, 7, 8, 9],
        "multimodal_inputs": None,
        "apply_chat_template_kwargs": {},
        "response": "5",
        "response_length": 3,
        "label": "5",
        "reward": 1.0,
        "loss_mask": [1, 1, 0],
        "weight_versions": ["12"],
        "rollout_log_probs": [-0.5, -0.25, -0.125],
        "status": "completed",
        "metadata": {"source": "gsm8k"},
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0},
    }
    d.update(changes)
    return d


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------


def test_parquet_to_pt_to_parquet_is_bitwise_lossless(tmp_path: Path) -> None:
    samples = _samples()
    write_rollout(tmp_path / "a.parquet", samples, metadata={"sampling": {"temperature": 1.0}})

    assert convert(tmp_path / "a.parquet", tmp_path / "a.pt") == len(samples)
    assert convert(tmp_path / "a.pt", tmp_path / "b.parquet") == len(samples)

    back = read_rollout(tmp_path / "b.parquet")
    assert back == read_rollout(tmp_path / "a.parquet")
    assert samples_to_table(back).equals(samples_to_table(samples))  # float32 log-probs bit for bit
    assert read_metadata(tmp_path / "b.parquet") == read_metadata(tmp_path / "a.parquet")


def test_save_then_load_returns_the_payload(tmp_path: Path) -> None:
    samples = _samples()
    save_slime_dump(tmp_path / "d" / "rollout_5.pt", 5, samples, {"dynamic_global_batch_size": 4})
    rollout_id, metadata, back = load_slime_dump(tmp_path / "d" / "rollout_5.pt")
    assert (rollout_id, metadata) == (5, {"dynamic_global_batch_size": 4})
    assert samples_to_table(back).equals(samples_to_table(samples))


def test_written_dump_is_plain_slime_layout(tmp_path: Path) -> None:
    save_slime_dump(tmp_path / "r.pt", 5, [_sample(0)])
    payload = torch.load(tmp_path / "r.pt", weights_only=True)
    assert set(payload) == {"rollout_id", "metadata", "samples"}
    d = payload["samples"][0]
    s = _sample(0)
    assert d["tokens"] == s.prompt_tokens + s.response_tokens
    assert d["tokens"][len(d["tokens"]) - d["response_length"] :] == s.response_tokens
    assert (d["index"], d["status"], d["weight_versions"]) == (0, "completed", ["3"])
    assert d["rollout_id"] is None  # slime's compact-rollout id, not our rollout iteration
    assert d["metadata"][ROLLFLOW_KEY] == {"rollout_id": 5, "seed": s.seed, "prompt_length": 6}


def test_eval_dump_round_trips_kind(tmp_path: Path) -> None:
    write_rollout(tmp_path / "e.parquet", [_sample(0)], kind="eval")
    convert(tmp_path / "e.parquet", tmp_path / "e.pt")
    assert load_slime_dump(tmp_path / "e.pt")[0] == "eval_5"
    convert(tmp_path / "e.pt", tmp_path / "e2.parquet")
    assert read_metadata(tmp_path / "e2.parquet")["kind"] == "eval"


def test_save_refuses_invalid_sample_and_reserved_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"sample 1 \(sample_index=1\).*status"):
        save_slime_dump(tmp_path / "x.pt", 0, [_sample(0), _sample(1, status="pending")])
    with pytest.raises(ValueError, match="reserved"):
        save_slime_dump(tmp_path / "x.pt", 0, [_sample(0, metadata={ROLLFLOW_KEY: 1})])
    assert not (tmp_path / "x.pt").exists()


# --------------------------------------------------------------------------------------------
# Pickle safety
# --------------------------------------------------------------------------------------------


def test_dump_of_objects_needs_trust_pickle(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    obj = FakeSlimeSample(
        index=3, group_index=1, tokens=[1, 2, 3, 4], response_length=2, reward=1.0, status="completed"
    )
    torch.save({"rollout_id": 2, "samples": [obj]}, path)

    with pytest.raises(SlimeFormatError, match="--trust-pickle") as info:
        load_slime_dump(path)
    assert str(path) in str(info.value) and "FakeSlimeSample" in str(info.value)

    rollout_id, metadata, (sample,) = load_slime_dump(path, trust_pickle=True)
    assert (rollout_id, metadata) == (2, {})
    assert (sample.sample_index, sample.prompt_tokens, sample.response_tokens) == (3, [1, 2], [3, 4])
    assert sample.loss_mask == [1, 1] and sample.rollout_log_probs == []


def test_trusted_dump_with_enum_status_and_arrays(tmp_path: Path) -> None:
    rows = [
        _real_slime_dict(
            0, status=FakeStatus.COMPLETED, tokens=np.array([1, 2, 3, 4]), reward=np.float64(0.5)
        ),
        _real_slime_dict(1, status=FakeStatus.PENDING, loss_mask=np.array([True, False, True])),
    ]
    torch.save({"rollout_id": 4, "samples": rows}, tmp_path / "4.pt")
    with pytest.raises(SlimeFormatError, match="--trust-pickle"):
        load_slime_dump(tmp_path / "4.pt")
    _, _, (a, b) = load_slime_dump(tmp_path / "4.pt", trust_pickle=True)
    assert (a.status, a.prompt_tokens, a.response_tokens, a.reward) == ("completed", [1], [2, 3, 4], 0.5)
    assert (b.status, b.metadata["slime_status"], b.loss_mask) == ("failed", "pending", [1, 0, 1])


def test_garbage_file_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a torch file at all")
    for trust in (False, True):
        with pytest.raises(SlimeFormatError, match="bad.pt"):
            load_slime_dump(tmp_path / "bad.pt", trust_pickle=trust)
    with pytest.raises(FileNotFoundError):
        load_slime_dump(tmp_path / "missing.pt")


def test_non_dump_payload_is_refused(tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(SlimeFormatError, match="'samples' list"):
        load_slime_dump(tmp_path / "list.pt")


# --------------------------------------------------------------------------------------------
# Dumps written by slime itself
# --------------------------------------------------------------------------------------------


def test_real_slime_dict_dump_loads_into_valid_samples(tmp_path: Path) -> None:
    torch.save({"rollout_id": 7, "samples": [_real_slime_dict(0), _real_slime_dict(1)]}, tmp_path / "7.pt")
    rollout_id, metadata, samples = load_slime_dump(tmp_path / "7.pt")
    assert (rollout_id, metadata, len(samples)) == (7, {}, 2)
    s = samples[0]
    s.validate()
    assert (s.rollout_id, s.group_index, s.sample_index) == (7, 0, 0)
    assert (s.prompt_tokens, s.response_tokens, s.response_length) == ([101, 102, 103, 104], [7, 8, 9], 3)
    assert (s.reward, s.status, s.label, s.weight_version) == (1.0, "completed", "5", 12)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [-0.5, -0.25, -0.125]
    assert s.seed == -1
    assert s.metadata == {
        "source": "gsm8k",
        "seed_unknown": True,
        "slime_extra": {
            "apply_chat_template_kwargs": {},
            "non_generation_time": 0.0,
            "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0},
        },
    }
    write_rollout(tmp_path / "7.parquet", samples)  # and they are storable as-is
    assert read_any(tmp_path / "7.parquet") == samples


def test_slime_statuses_rewards_and_extras_are_mapped_and_noted(tmp_path: Path) -> None:
    rows = [
        _real_slime_dict(0, status="pending", loss_mask=None, rollout_log_probs=None),
        _real_slime_dict(1, reward={"acc": 0.5, "fmt": 1.0}, weight_versions=["3", "4"], remove_sample=True),
        _real_slime_dict(2, routed=torch.zeros(2, 2), prompt=[{"role": "user", "content": "hi"}], label=None),
    ]
    torch.save({"rollout_id": 1, "metadata": {"reward_key": "acc"}, "samples": rows}, tmp_path / "1.pt")
    _, _, (pending, dict_reward, odd) = load_slime_dump(tmp_path / "1.pt")

    assert pending.status == "failed" and pending.metadata["slime_status"] == "pending"
    assert pending.loss_mask == [1, 1, 1] and pending.rollout_log_probs == []
    assert dict_reward.reward == 0.5 and dict_reward.metadata["slime_reward"] == {"acc": 0.5, "fmt": 1.0}
    assert dict_reward.weight_version == 4 and dict_reward.metadata["slime_weight_versions"] == ["3", "4"]
    assert dict_reward.loss_mask == [0, 0, 0] and dict_reward.metadata["slime_remove_sample"] is True
    assert odd.metadata["slime_dropped_keys"] == ["routed"]  # a tensor: not JSON, dropped but named
    assert odd.prompt == '[{"content": "hi", "role": "user"}]' and odd.metadata["slime_prompt_is_json"]
    assert odd.label == ""


def test_dict_reward_without_reward_key_is_an_error(tmp_path: Path) -> None:
    torch.save({"rollout_id": 1, "samples": [_real_slime_dict(0, reward={"acc": 1.0})]}, tmp_path / "1.pt")
    with pytest.raises(SlimeFormatError, match=r"sample 0 \(index=0\): reward is a dict .*reward_key"):
        load_slime_dump(tmp_path / "1.pt")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"response_length": 9}, "response_length 9 is outside"),
        ({"reward": None}, "reward must be a number"),
        ({"loss_mask": [1, 1]}, "loss_mask has 2 entries"),
        ({"rollout_log_probs": [-1.0]}, "rollout_log_probs has 1 entries"),
        ({"status": None}, "no status"),
        ({"loss_mask": [1, 2, 0]}, r"loss_mask values must be 0 or 1, got \[2\]"),
        ({"rollout_log_probs": [-1.0, None, -1.0]}, "NoneType"),
        ({"tokens": [1, 2, "3"]}, "tokens must hold ints"),
    ],
)
def test_unmappable_slime_samples_are_named(tmp_path: Path, changes: dict, message: str) -> None:
    torch.save(
        {"rollout_id": 1, "samples": [_real_slime_dict(0), _real_slime_dict(1, **changes)]}, tmp_path / "1.pt"
    )
    with pytest.raises(SlimeFormatError, match=rf"1\.pt: sample 1 \(index=1\): .*{message}"):
        load_slime_dump(tmp_path / "1.pt")


def test_edited_tokens_contradicting_recorded_prompt_length_are_caught(tmp_path: Path) -> None:
    save_slime_dump(tmp_path / "r.pt", 5, [_sample(0)])
    payload = torch.load(tmp_path / "r.pt", weights_only=True)
    payload["samples"][0]["tokens"].insert(0, 2)
    torch.save(payload, tmp_path / "r.pt")
    with pytest.raises(SlimeFormatError, match="records 6 prompt tokens"):
        load_slime_dump(tmp_path / "r.pt")


# --------------------------------------------------------------------------------------------
# Dispatch by extension
# --------------------------------------------------------------------------------------------


def test_read_and_write_any_dispatch_on_extension(tmp_path: Path) -> None:
    samples = _samples()
    for name in ("x.parquet", "x.pt", "X.PT"):
        write_any(tmp_path / name, 5, samples)
        assert samples_to_table(read_any(tmp_path / name)).equals(samples_to_table(samples))
    for bad in ("x.json", "x"):
        with pytest.raises(ValueError, match=r"extension .*\.parquet.*\.pt"):
            read_any(tmp_path / bad)
        with pytest.raises(ValueError, match="extension"):
            write_any(tmp_path / bad, 5, samples)
