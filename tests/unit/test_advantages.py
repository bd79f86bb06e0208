"""Hand-computed checks of the registered advantage estimators."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.advantages import (
    ADVANTAGE_ESTIMATORS,
    GRPO_STD_EPS,
    get_advantage_estimator,
    group_reward_stats,
    grpo,
    register_advantage,
    reinforce_plus_plus_baseline,
    rloo,
)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_registry_contents_and_lookup() -> None:
    assert {"grpo", "reinforce_plus_plus_baseline", "rloo"} <= set(ADVANTAGE_ESTIMATORS)
    assert get_advantage_estimator("grpo") is grpo
    assert get_advantage_estimator("rloo") is rloo


def test_unknown_estimator_names_it_and_known_ones() -> None:
    with pytest.raises(ValueError, match="nope") as info:
        get_advantage_estimator("nope")
    assert "grpo" in str(info.value) and "rloo" in str(info.value)


def test_duplicate_registration_rejected() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(grpo)


def test_grpo_hand_computed() -> None:
    # Group 0: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735...
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # ~0.8660239, 1.5e-6 below 0.5/std: the eps is visible
    adv = grpo(REWARDS, GROUPS)
    assert adv.dtype == torch.float32
    want = torch.tensor([expected, -expected, -expected, expected, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, want, rtol=0, atol=2e-7)
    assert abs(adv[0].item() - 0.5 / math.sqrt(1 / 3)) > 1e-6
    # Group 1 is all equal: 0 / (0 + eps) is exactly 0, not NaN.
    assert torch.equal(adv[4:], torch.zeros(4))


def test_grpo_without_std_normalisation_only_centres() -> None:
    adv = grpo(REWARDS, GROUPS, normalize_std=False)
    assert torch.equal(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]))


def test_grpo_group_of_one_skips_std() -> None:
    adv = grpo(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([7, 9, 9]))
    # Singleton group 7: r - mean = 0, no division by an undefined std.
    assert adv[0].item() == 0.0
    # Group 9: mean 1.5, unbiased std of [1, 2] = sqrt(0.5).
    e = 0.5 / (math.sqrt(0.5) + GRPO_STD_EPS)
    torch.testing.assert_close(adv[1:], torch.tensor([-e, e]), rtol=0, atol=2e-7)


def test_reinforce_plus_plus_baseline_subtracts_mean_only() -> None:
    adv = reinforce_plus_plus_baseline(torch.tensor([2.0, 0.0, 4.0, 5.0]), torch.tensor([0, 0, 0, 1]))
    assert torch.equal(adv, torch.tensor([0.0, -2.0, 2.0, 0.0]))
    # normalize_std is accepted but has no effect.
    assert torch.equal(
        adv,
        reinforce_plus_plus_baseline(
            torch.tensor([2.0, 0.0, 4.0, 5.0]), torch.tensor([0, 0, 0, 1]), normalize_std=False
        ),
    )


def test_rloo_leave_one_out() -> None:
    # Group 0 = [1, 0, 0, 1]: r_0 - mean(0, 0, 1) = 1 - 1/3; r_1 - mean(1, 0, 1) = -2/3.
    adv = rloo(REWARDS, GROUPS)
    want = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-7)
    # Singleton group: no baseline available -> 0.
    assert rloo(torch.tensor([5.0]), torch.tensor([0])).item() == 0.0


@pytest.mark.parametrize("name", ["grpo", "reinforce_plus_plus_baseline", "rloo"])
def test_non_contiguous_groups_match_contiguous(name: str) -> None:
    fn = get_advantage_estimator(name)
    rewards = torch.tensor([0.3, 1.0, 0.0, 0.7, 2.0, 0.5, 1.5, 0.0, 0.25])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    ref = fn(rewards, groups)
    # Interleave the groups (within-group order preserved) and relabel the ids: results follow the samples.
    perm = torch.tensor([6, 0, 3, 1, 7, 4, 2, 8, 5])
    relabel = torch.tensor([40, -3, 12])  # arbitrary, unsorted ids
    out = fn(rewards[perm], relabel[groups[perm]])
    assert torch.equal(out, ref[perm])


@pytest.mark.parametrize("name", ["grpo", "reinforce_plus_plus_baseline", "rloo"])
def test_deterministic_and_pure(name: str) -> None:
    fn = get_advantage_estimator(name)
    rewards = torch.rand(64, generator=torch.Generator().manual_seed(0))
    groups = torch.arange(64) % 8
    before = rewards.clone()
    assert torch.equal(fn(rewards, groups), fn(rewards, groups))
    assert torch.equal(rewards, before)


def _one_group_at_a_time(name: str, rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The estimators' formulas on each group's 1-D rewards alone."""
    out = torch.empty_like(rewards)
    for gid in torch.unique(groups):
        idx = torch.nonzero(groups == gid, as_tuple=True)[0]
        r, n = rewards[idx], len(idx)
        if name == "grpo":
            w = r.double()
            std = (((w - w.mean()) ** 2).sum() / (n - 1)).sqrt().to(r.dtype)
            out[idx] = (r - r.mean()) / (std + GRPO_STD_EPS) if n > 1 else r - r.mean()
        elif name == "rloo":
            out[idx] = r - (r.sum() - r) / (n - 1) if n > 1 else torch.zeros_like(r)
        else:
            out[idx] = r - r.mean()
    return out


@pytest.mark.parametrize("name", ["grpo", "reinforce_plus_plus_baseline", "rloo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_all_groups_at_once_give_the_bits_of_one_group_at_a_time(name: str, dtype: torch.dtype) -> None:
    # equal group sizes take one batched reduction over rows [G, k]; it must round exactly as a group alone
    # (torch.std does not in float64: grpo's std is written out)
    gen = torch.Generator().manual_seed(1)
    for size in (1, 2, 3, 4, 5, 8, 16, 33, 64, 128):
        for equal in (True, False):
            groups = torch.arange(24).repeat_interleave(size)
            if not equal:
                groups = groups[size // 2 :]  # the first group smaller than the others
            groups = groups[torch.randperm(len(groups), generator=gen)] * 7 - 50  # interleaved, unsorted ids
            rewards = (torch.randn(len(groups), generator=gen) * 3).to(dtype)
            rewards[: len(rewards) // 3] = rewards[: len(rewards) // 3].round()  # ties, as 0/1 rewards give
            got = get_advantage_estimator(name)(rewards, groups)
            assert torch.equal(got, _one_group_at_a_time(name, rewards, groups)), (size, equal)


def test_grpo_of_binary_rewards_has_the_bits_of_torch_std() -> None:
    # slime's formula, (r - mean) / (torch.std(r) + eps) per group, computes a float32 std in float64: so does grpo
    gen = torch.Generator().manual_seed(2)
    for size in (2, 3, 4, 8, 16):
        rewards = torch.randint(0, 2, (32 * size,), generator=gen).float()
        groups = torch.arange(32).repeat_interleave(size)
        want = torch.cat([(r - r.mean()) / (r.std() + GRPO_STD_EPS) for r in rewards.view(32, size)])
        assert torch.equal(grpo(rewards, groups), want), size


def test_bad_inputs_rejected() -> None:
    with pytest.raises(ValueError, match="1-D"):
        grpo(torch.zeros(4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        grpo(torch.zeros(2), torch.zeros(2))
    with pytest.raises(TypeError, match="floating"):
        grpo(torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))


def test_group_reward_stats() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])  # group 3 is a singleton
    stats = group_reward_stats(rewards, groups)
    assert stats["num_groups"] == 4
    assert stats["zero_std_count"] == 3
    assert stats["zero_std_by_value"] == {1.0: 1, 0.0: 1, 0.5: 1}
    # Only group 0 ([1, 0], unbiased std sqrt(0.5)) has a non-zero std among the three groups of size > 1.
    assert stats["mean_group_std"] == pytest.approx(math.sqrt(0.5) / 3)
