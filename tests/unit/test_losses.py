"""Hand-computed checks of the policy losses, KL estimators, logits helpers and policy_objective."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.losses import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    entropy_from_logits,
    get_kl_estimator,
    get_policy_loss,
    log_probs_from_logits,
    masked_sample_mean,
    policy_objective,
    ppo_clip,
    register_kl,
    register_policy_loss,
    vanilla_pg,
)

EPS, EPS_HIGH = 0.2, 0.28


def _tok(*values: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A [1, T] token tensor."""
    return torch.tensor([list(values)], dtype=dtype)


# ------------------------------------------------------------------------------------------------ registries


def test_registries_and_unknown_names() -> None:
    assert {"ppo_clip", "vanilla_pg"} <= set(POLICY_LOSSES)
    assert {"k1", "k2", "k3", "low_var_kl"} <= set(KL_ESTIMATORS)
    assert get_policy_loss("ppo_clip") is ppo_clip
    with pytest.raises(ValueError, match="'gspo_x'.*ppo_clip"):
        get_policy_loss("gspo_x")
    with pytest.raises(ValueError, match="'k9'.*low_var_kl"):
        get_kl_estimator("k9")
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo_clip")(ppo_clip)
    with pytest.raises(ValueError, match="already registered"):
        register_kl("k1")(get_kl_estimator("k1"))


def test_policy_objective_unknown_names() -> None:
    x = torch.zeros(1, 2)
    common = dict(eps_clip=EPS, eps_clip_high=EPS_HIGH, normaliser=1.0)
    with pytest.raises(ValueError, match="unknown policy loss 'nope'"):
        policy_objective(x, x, x, torch.ones(1, 2), x, policy_loss="nope", **common)
    with pytest.raises(ValueError, match="unknown KL estimator 'nope'"):
        policy_objective(x, x, x, torch.ones(1, 2), x, x, use_kl_loss=True, kl_loss_type="nope", **common)


# --------------------------------------------------------------------------------------------- KL estimators


def test_kl_estimators_hand_computed() -> None:
    # log r = log_probs - ref = [0, 1, -1].
    lp = _tok(-1.0, -1.0, -2.0)
    ref = _tok(-1.0, -2.0, -1.0)
    e = math.e
    torch.testing.assert_close(get_kl_estimator("k1")(lp, ref), _tok(0.0, 1.0, -1.0))
    torch.testing.assert_close(get_kl_estimator("k2")(lp, ref), _tok(0.0, 0.5, 0.5))
    k3 = _tok(0.0, 1 / e - 1 + 1, e - 1 - 1)  # exp(-lr) - 1 + lr
    torch.testing.assert_close(get_kl_estimator("k3")(lp, ref), k3)
    torch.testing.assert_close(get_kl_estimator("low_var_kl")(lp, ref), k3)


def test_low_var_kl_clamped_k3_not() -> None:
    # log r = -5: k3 = e^5 - 1 - 5 = 142.41...; low_var_kl caps it at 10.
    lp, ref = _tok(-6.0), _tok(-1.0)
    assert get_kl_estimator("k3")(lp, ref).item() == pytest.approx(math.exp(5) - 6)
    assert get_kl_estimator("low_var_kl")(lp, ref).item() == 10.0
    # log r = +20: k3 = e^-20 - 1 + 20 ~ 19 -> also clamped to 10.
    assert get_kl_estimator("low_var_kl")(_tok(0.0), _tok(-20.0)).item() == 10.0


# --------------------------------------------------------------------------------------------- policy losses


def _ppo(ratio: float, adv: float, eps_clip_c: float | None = None) -> tuple[float, float, float]:
    old = _tok(-1.0)
    new = old + math.log(ratio)
    loss, clipfrac, ppo_kl = ppo_clip(
        new, old, _tok(adv), eps_clip=EPS, eps_clip_high=EPS_HIGH, eps_clip_c=eps_clip_c
    )
    return loss.item(), clipfrac.item(), ppo_kl.item()


def test_ppo_clip_ratio_inside_band_unclipped() -> None:
    loss, clipfrac, ppo_kl = _ppo(1.1, 2.0)
    assert loss == pytest.approx(-1.1 * 2.0)
    assert clipfrac == 0.0
    assert ppo_kl == pytest.approx(-math.log(1.1))  # old - new


def test_ppo_clip_above_band_positive_advantage_clipped() -> None:
    loss, clipfrac, _ = _ppo(1.5, 2.0)
    assert loss == pytest.approx(-(1 + EPS_HIGH) * 2.0)  # max(-3.0, -2.56)
    assert clipfrac == 1.0


def test_ppo_clip_below_band_negative_advantage_clipped() -> None:
    loss, clipfrac, _ = _ppo(0.5, -1.0)
    assert loss == pytest.approx((1 - EPS) * 1.0)  # max(0.5, 0.8)
    assert clipfrac == 1.0


def test_ppo_clip_outside_band_on_the_improving_side_not_clipped() -> None:
    # ratio above the band with A<0: the unclipped (larger) loss is kept, as in PPO.
    loss, clipfrac, _ = _ppo(1.5, -1.0)
    assert loss == pytest.approx(1.5)
    assert clipfrac == 0.0


def test_ppo_dual_clip() -> None:
    # A<0, ratio 5: clipped PPO loss is 5.0; dual clip bounds it by -eps_clip_c * A = 3.0.
    loss, clipfrac, _ = _ppo(5.0, -1.0, eps_clip_c=3.0)
    assert loss == pytest.approx(3.0)
    assert clipfrac == 0.0
    # Below the bound nothing changes; A>0 tokens are never dual-clipped.
    assert _ppo(2.0, -1.0, eps_clip_c=3.0)[0] == pytest.approx(2.0)
    assert _ppo(5.0, 1.0, eps_clip_c=3.0)[0] == pytest.approx(-(1 + EPS_HIGH))


def test_ppo_dual_clip_validates_bound() -> None:
    with pytest.raises(ValueError, match="eps_clip_c.*> 1.0"):
        _ppo(1.0, 1.0, eps_clip_c=1.0)


def test_vanilla_pg() -> None:
    lp, old, adv = _tok(-0.5, -2.0), _tok(-1.0, -1.0), _tok(2.0, -1.0)
    loss, clipfrac, ppo_kl = vanilla_pg(lp, old, adv, eps_clip=EPS, eps_clip_high=EPS_HIGH)
    torch.testing.assert_close(loss, _tok(1.0, -2.0))
    assert torch.equal(clipfrac, torch.zeros(1, 2))
    torch.testing.assert_close(ppo_kl, _tok(-0.5, 1.0))


# ------------------------------------------------------------------------------------------ logits helpers


def test_entropy_of_uniform_logits_is_log_v() -> None:
    v = 7
    ent = entropy_from_logits(torch.full((2, 3, v), 4.2, dtype=torch.bfloat16))
    assert ent.dtype == torch.float32 and ent.shape == (2, 3)
    torch.testing.assert_close(ent, torch.full((2, 3), math.log(v)))


def test_entropy_stable_for_extreme_and_masked_logits() -> None:
    logits = torch.tensor([[[1e4, 0.0, -1e4], [0.0, 0.0, float("-inf")]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent.detach(), torch.tensor([[0.0, math.log(2)]]))
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_log_probs_from_logits() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])  # softmax: [1/4, 3/4], [1/2, 1/2]
    tokens = torch.tensor([[1, 0]])
    lp = log_probs_from_logits(logits, tokens)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.5)]]))
    with pytest.raises(ValueError):
        log_probs_from_logits(logits, torch.tensor([1, 0]))


def test_masked_sample_mean() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    out = masked_sample_mean(x, mask)
    # Masked NaN is ignored; the all-zero-mask sample gives 0, not NaN.
    assert torch.equal(out, torch.tensor([1.5, 5.0, 0.0]))


# ---------------------------------------------------------------------------------------- policy_objective


def _batch(b: int = 4, t: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    mask = (torch.rand(b, t, generator=g) > 0.3).long()
    mask[0] = 0  # a fully masked-out sample must not poison anything
    return {
        "log_probs": old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "old_log_probs": old,
        "advantages_tok": torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).contiguous(),
        "loss_mask": mask,
        "entropy_tok": torch.rand(b, t, generator=g, dtype=torch.float64),
        "ref_log_probs": old + 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64),
        "rollout_log_probs": old + 0.01 * torch.randn(b, t, generator=g, dtype=torch.float64),
    }


def _objective(batch: dict[str, torch.Tensor], **kw: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    args = dict(eps_clip=EPS, eps_clip_high=EPS_HIGH, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    args.update(kw)
    return policy_objective(
        batch["log_probs"],
        batch["old_log_probs"],
        batch["advantages_tok"],
        batch["loss_mask"],
        batch["entropy_tok"],
        batch["ref_log_probs"],
        rollout_log_probs=batch["rollout_log_probs"],
        **args,
    )


def test_objective_on_policy_has_zero_ppo_kl_and_clipfrac() -> None:
    batch = _batch()
    batch["log_probs"] = batch["old_log_probs"].clone()
    loss, m = _objective(batch, normaliser=4.0)
    assert m["ppo_kl"].item() == 0.0
    assert m["pg_clipfrac"].item() == 0.0
    # ratio == 1 exactly, so pg_loss is the negated masked mean advantage.
    want = -masked_sample_mean(batch["advantages_tok"], batch["loss_mask"]).sum() / 4.0
    torch.testing.assert_close(m["pg_loss"], want)


def test_objective_hand_computed_single_sample() -> None:
    # One sample, two live tokens + one masked token; ratio 1 on token 0, e^0.1 on token 1.
    lp = _tok(-1.0, -0.9, -5.0).requires_grad_()
    old = _tok(-1.0, -1.0, -1.0)
    adv = _tok(2.0, 2.0, 2.0)
    mask = torch.tensor([[1, 1, 0]])
    ent = _tok(0.5, 1.5, 100.0)
    ref = _tok(-1.0, -1.0, -1.0)
    rollout = _tok(-1.25, -0.5, 7.0)
    loss, m = policy_objective(
        lp,
        old,
        adv,
        mask,
        ent,
        ref,
        eps_clip=EPS,
        eps_clip_high=EPS_HIGH,
        entropy_coef=0.1,
        use_kl_loss=True,
        kl_loss_coef=0.5,
        kl_loss_type="k1",
        rollout_log_probs=rollout,
        normaliser=2.0,
    )
    r1 = math.exp(0.1)  # 1.105 < 1.28: unclipped
    pg = (-1.0 * 2 + -r1 * 2) / 2 / 2.0
    entropy = (0.5 + 1.5) / 2 / 2.0
    kl = (0.0 + 0.1) / 2 / 2.0
    assert set(m) == {
        "pg_loss",
        "pg_clipfrac",
        "ppo_kl",
        "entropy_loss",
        "loss",
        "kl_loss",
        "train_rollout_logprob_abs_diff",
    }
    assert m["pg_loss"].item() == pytest.approx(pg)
    assert m["pg_clipfrac"].item() == 0.0
    assert m["ppo_kl"].item() == pytest.approx((0.0 - 0.1) / 2 / 2.0)
    assert m["entropy_loss"].item() == pytest.approx(entropy)
    assert m["kl_loss"].item() == pytest.approx(kl)
    assert m["train_rollout_logprob_abs_diff"].item() == pytest.approx((0.25 + 0.5) / 2 / 2.0)
    assert loss.item() == pytest.approx(pg - 0.1 * entropy + 0.5 * kl)
    assert m["loss"].item() == loss.item()
    assert all(not v.requires_grad and v.dim() == 0 for v in m.values())


def test_objective_metric_keys_without_optional_terms() -> None:
    batch = _batch()
    loss, m = policy_objective(
        batch["log_probs"],
        batch["old_log_probs"],
        batch["advantages_tok"],
        batch["loss_mask"],
        batch["entropy_tok"],
        eps_clip=EPS,
        eps_clip_high=EPS_HIGH,
        normaliser=4.0,
    )
    assert set(m) == {"pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss", "loss"}
    # entropy_coef defaults to 0: the loss is exactly the policy-gradient loss.
    assert torch.equal(loss.detach(), m["pg_loss"])


def test_objective_gradient_flows_to_log_probs_only_on_masked_tokens() -> None:
    batch = _batch()
    batch["log_probs"].requires_grad_()
    batch["entropy_tok"].requires_grad_()
    loss, _ = _objective(batch, normaliser=4.0)
    loss.backward()
    grad = batch["log_probs"].grad
    assert grad is not None and torch.isfinite(grad).all()
    assert grad.abs().sum() > 0
    assert torch.equal(grad[batch["loss_mask"] == 0], torch.zeros_like(grad[batch["loss_mask"] == 0]))
    # The entropy bonus pushes entropy up: d loss / d entropy = -entropy_coef * mask / (n_tok * normaliser) <= 0.
    assert (batch["entropy_tok"].grad <= 0).all()


def test_objective_sums_over_micro_batches() -> None:
    full = _batch(b=6, t=5, seed=3)
    for t in full.values():
        if t.is_floating_point():
            t.requires_grad_()
    loss_full, m_full = _objective(full, normaliser=6.0)
    loss_full.backward()
    grad_full = full["log_probs"].grad.clone()
    full["log_probs"].grad = None

    loss_sum = torch.zeros((), dtype=torch.float64)
    metric_sum: dict[str, torch.Tensor] = {}
    for half in (slice(0, 3), slice(3, 6)):
        part = {k: v[half] for k, v in full.items()}
        loss_half, m_half = _objective(part, normaliser=6.0)
        loss_half.backward()  # gradients accumulate across micro-batches like in the trainer
        loss_sum = loss_sum + loss_half.detach()
        for k, v in m_half.items():
            metric_sum[k] = metric_sum.get(k, 0) + v

    torch.testing.assert_close(loss_sum, loss_full.detach(), rtol=0, atol=1e-12)
    assert set(metric_sum) == set(m_full)
    for k in m_full:
        torch.testing.assert_close(metric_sum[k], m_full[k], rtol=0, atol=1e-7, msg=k)
    torch.testing.assert_close(full["log_probs"].grad, grad_full, rtol=0, atol=1e-12)


def test_objective_sums_over_micro_batches_float32() -> None:
    batch = {k: v.float() if v.is_floating_point() else v for k, v in _batch(b=8, t=6, seed=5).items()}
    loss_full, _ = _objective(batch, normaliser=8.0)
    halves = [
        _objective({k: v[s] for k, v in batch.items()}, normaliser=8.0)[0] for s in (slice(0, 4), slice(4, 8))
    ]
    torch.testing.assert_close(halves[0] + halves[1], loss_full, rtol=0, atol=1e-7)


def test_objective_validation() -> None:
    batch = _batch()
    with pytest.raises(ValueError, match="requires ref_log_probs"):
        policy_objective(
            batch["log_probs"],
            batch["old_log_probs"],
            batch["advantages_tok"],
            batch["loss_mask"],
            batch["entropy_tok"],
            eps_clip=EPS,
            eps_clip_high=EPS_HIGH,
            use_kl_loss=True,
            normaliser=4.0,
        )
    with pytest.raises(ValueError, match="normaliser"):
        _objective(batch, normaliser=0.0)
    with pytest.raises(ValueError, match="loss_mask shape"):
        _objective({**batch, "loss_mask": batch["loss_mask"][:, :2]}, normaliser=4.0)
    with pytest.raises(ValueError, match="eps_clip_c"):
        _objective(batch, normaliser=4.0, eps_clip_c=0.5)
