"""slime's trainer-side flags as pure functions: failed samples out of group statistics, advantage
whitening, the per-token loss, token-budget micro-batches, DP balancing, Megatron's weight-decay rule, the
recomputed layers and the config rules."""

from __future__ import annotations

import pytest
import torch

from config import RunConfig
from trainers.advantages import advantages_of_valid, grpo, whiten_weighted
from trainers.batching import balanced_partition, first_fit, schedule, split_to_count, token_schedule
from trainers.core import decay_groups
from trainers.losses import policy_objective
from trainers.recompute import recomputed_layers


# -- failed samples ------------------------------------------------------------------------------------------
def test_a_failed_sample_is_left_out_of_its_group_and_gets_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    valid = torch.tensor([True, True, True, False, True, True, True, True])
    for name in ("grpo", "reinforce_plus_plus_baseline", "rloo"):
        adv = advantages_of_valid(name, rewards, groups, valid)
        assert torch.equal(adv[:4], torch.zeros(4)), name  # the valid ones all scored 1.0: no signal
        assert torch.equal(adv[4:], advantages_of_valid(name, rewards[4:], groups[4:], valid[4:])), name
    # with it counted (the old behaviour) the group would have had a signal
    assert grpo(rewards[:4], groups[:4]).abs().sum() > 0


def test_all_valid_is_the_estimator_bitwise_and_all_failed_is_zero():
    rewards, groups = torch.rand(12), torch.arange(12) // 4
    assert torch.equal(
        advantages_of_valid("grpo", rewards, groups, torch.ones(12, dtype=torch.bool)), grpo(rewards, groups)
    )
    assert torch.equal(
        advantages_of_valid("grpo", rewards, groups, torch.zeros(12, dtype=torch.bool)), torch.zeros(12)
    )
    with pytest.raises(ValueError, match="valid"):
        advantages_of_valid("grpo", rewards, groups, torch.ones(11, dtype=torch.bool))


# -- --normalize-advantages ----------------------------------------------------------------------------------
def test_whitening_is_slimes_masked_whitening_per_token_and_per_sample():
    values = torch.tensor([1.0, 1.0, 1.0, -2.0, -2.0, 5.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    kept = values[mask.bool()]
    want = (values - kept.mean()) / torch.sqrt(kept.var(unbiased=True) + 1e-8)  # var(): Bessel's correction
    torch.testing.assert_close(whiten_weighted(values, mask), want, rtol=1e-12, atol=1e-12)
    # per sample, weighted by the sample's loss tokens = per token on the broadcast advantages
    per_sample = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    tokens = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    broadcast = per_sample.repeat_interleave(tokens.long())
    torch.testing.assert_close(
        whiten_weighted(per_sample, tokens).repeat_interleave(tokens.long()),
        whiten_weighted(broadcast, torch.ones_like(broadcast)),
        rtol=1e-12,
        atol=1e-12,
    )
    with pytest.raises(ValueError, match="no loss token"):
        whiten_weighted(values, torch.zeros_like(values))


# -- --calculate-per-token-loss ----------------------------------------------------------------------------
def test_per_token_loss_is_the_token_mean_and_per_sample_the_mean_of_sample_means():
    lp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [4.0, 4.0, 4.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    common = dict(policy_loss="vanilla_pg", eps_clip=0.2, eps_clip_high=0.2)
    # vanilla_pg at lp = 0: per-token loss -lp*A = 0, gradient -A on every loss token
    loss, _ = policy_objective(
        lp, lp.detach(), adv, mask, torch.zeros_like(lp), normaliser=4.0, per_token=True, **common
    )
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.equal(grad, -adv * mask / 4)  # every token weighs 1/4 (4 loss tokens)
    loss, _ = policy_objective(lp, lp.detach(), adv, mask, torch.zeros_like(lp), normaliser=2.0, **common)
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.equal(grad, -adv * mask / torch.tensor([[3.0], [1.0]], dtype=torch.float64) / 2)


# -- --use-dynamic-batch-size / --max-tokens-per-gpu / --balance-data -----------------------------------------
def test_first_fit_is_slimes_example_and_an_oversized_sample_stands_alone():
    assert first_fit([100, 200, 300], 300) == [[0, 1], [2]]  # slime's help text
    assert first_fit([5, 9, 2, 3], 6) == [[0], [1], [2, 3]]


def test_split_to_count_halves_the_heaviest_bin_by_tokens():
    assert split_to_count([[0, 1, 2], [3]], 3, [4, 3, 2, 1]) == [[0], [3], [1, 2]]
    with pytest.raises(ValueError, match="cannot make 3"):
        split_to_count([[0], [1]], 3, [1, 1])


def test_balanced_partition_equal_sizes_and_sums():
    parts = balanced_partition([5, 1, 4, 2, 3, 3], 2)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert [len(p) for p in parts] == [3, 3]
    assert [sum([5, 1, 4, 2, 3, 3][i] for i in p) for p in parts] == [9, 9]
    assert balanced_partition([7, 1, 2], 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="equal parts"):
        balanced_partition([1, 2, 3], 2)


def test_token_schedule_budgets_ranks_and_balance():
    lengths = [3, 5, 2, 8, 1, 1, 4, 4]
    ranks = [token_schedule(lengths, 4, 2, r, micro_batch_size=1, max_tokens=6) for r in range(2)]
    for step in range(2):
        assert len(ranks[0][step]) == len(ranks[1][step])  # the same number of micro-batches on every rank
        got = sorted(p for r in ranks for mb in r[step] for p in mb)
        assert got == list(range(4 * step, 4 * step + 4))  # each sample of the step once
        for r in ranks:
            for mb in r[step]:
                assert len(mb) == 1 or sum(lengths[p] for p in mb) <= 6
    # balancing on one rank changes nothing; on two it evens the workload out
    static = schedule(8, 4, 1, 0, 2)
    assert token_schedule(lengths, 4, 1, 0, micro_batch_size=2, workloads=lengths) == static
    work = [5, 1, 5, 1]  # in turn, rank 0 would get both heavy samples
    assert [token_schedule(work, 4, 2, r, micro_batch_size=1)[0] for r in range(2)] == [
        [[0], [2]],
        [[1], [3]],
    ]
    balanced = [token_schedule(work, 4, 2, r, micro_batch_size=1, workloads=work)[0] for r in range(2)]
    assert sorted(sum(work[p] for mb in r for p in mb) for r in balanced) == [6, 6]


# -- Megatron's weight-decay rule ------------------------------------------------------------------------------
def test_decay_groups_skip_biases_and_1d_tensors_and_keep_the_order():
    w1, b1, n1, w2 = (torch.nn.Parameter(torch.zeros(s)) for s in ((2, 2), (2,), (2,), (3, 2)))
    names = ["a.weight", "a.bias", "norm.weight", "b.weight"]
    groups = decay_groups([w1, b1, n1, w2], names, 0.1)
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(1, 0.1), (2, 0.0), (1, 0.1)]
    assert [p for g in groups for p in g["params"]] == [w1, b1, n1, w2]
    assert decay_groups([w1, b1], names[:2], 0.0) == [{"params": [w1, b1], "weight_decay": 0.0}]


# -- --recompute-* ---------------------------------------------------------------------------------------------
def test_recomputed_layers_follow_megatrons_rule():
    assert recomputed_layers(None, None, None, 4) == set()
    assert recomputed_layers("full", "uniform", 2, 4) == {0, 1, 2, 3}
    assert recomputed_layers("full", "block", 3, 4) == {0, 1, 2}
    assert recomputed_layers("selective", None, None, 4) == {0, 1, 2, 3}


# -- config ------------------------------------------------------------------------------------------------------
def _cfg(**train):
    return RunConfig.model_validate(
        {"rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 4}, "train": train}
    )


def test_num_steps_per_rollout_sets_the_global_batch():
    cfg = _cfg(num_steps_per_rollout=2)
    assert (cfg.global_batch_size, cfg.steps_per_rollout) == (8, 2)
    assert _cfg(num_steps_per_rollout=2, global_batch_size=8).global_batch_size == 8
    with pytest.raises(ValueError, match="disagrees with --num-steps-per-rollout 2"):
        _cfg(num_steps_per_rollout=2, global_batch_size=4)
    with pytest.raises(ValueError, match="exceeds"):
        _cfg(num_steps_per_rollout=17)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"use_dynamic_batch_size": True}, "needs --max-tokens-per-gpu"),
        ({"recompute_granularity": "full"}, "needs --recompute-method"),
        (
            {"recompute_granularity": "selective", "recompute_num_layers": 1},
            "takes no --recompute-num-layers",
        ),
        ({"kl_coef": 0.1, "use_kl_loss": True, "kl_loss_coef": 0.1}, "set only one of them"),
    ],
)
def test_slime_flag_combinations_refused(train, message):
    with pytest.raises(ValueError, match=message):
        _cfg(**train)


def test_failed_samples_are_counted_and_left_out_of_zero_std_groups(tmp_path):
    from tasks.metrics import reward_stats
    from tests.megatron_helpers import synthetic_rollout

    samples, _ = synthetic_rollout(tmp_path / "r.parquet", groups=2, per_group=4)
    for s in samples:
        s.reward, s.status = (0.0, "failed") if s.sample_index in (3, 7) else (1.0, "completed")
    stats = reward_stats(samples, 4)
    assert stats["rollout/failed_count"] == 2.0 and stats["rollout/failed_ratio"] == 0.25
    assert stats["rollout/zero_std/count_1.0"] == 2.0  # both groups: their valid samples all scored 1.0
