"""--loss-type sft_loss / custom_loss: slime's reducer and log-prob helper on rollflow's layout, the batch a plug-in
receives, the checks on what it returns, and the config and settings that select it."""

from __future__ import annotations

import pytest
import torch

from artifacts.schema import Sample
from config import LossConfig, RunConfig
from examples.custom_loss.cispo import cispo_loss
from rollout.extensions import ExtensionError
from trainers.custom_loss import (
    build_batch,
    get_log_probs_and_entropy,
    plugin_loss,
    resolve_loss,
    sft_loss,
    sum_of_sample_mean,
)
from trainers.losses import entropy_from_logits, log_probs_from_logits, masked_sample_mean, policy_objective
from trainers.settings import trainer_settings

PROMPTS = [[5, 6, 7], [5, 8]]
RESPONSES = [[9, 10, 11], [12]]
MASKS = [[1, 0, 1], [1]]


def _padded(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (width - len(r)) for r in rows])


def _batch(
    logits: torch.Tensor, advantages: list[float], old: list[list[float]], adv: torch.Tensor | None = None
) -> dict:
    samples = [
        Sample(0, i, i, "p", p, "r", r, len(r), "", 1.0, "completed", m, [], 0, 0)
        for i, (p, r, m) in enumerate(zip(PROMPTS, RESPONSES, MASKS, strict=True))
    ]
    rows = {i: {"log_probs": lp} for i, lp in enumerate(old)}
    adv = torch.tensor(advantages) if adv is None else adv
    return build_batch(samples, adv, rows, use_rollout_lp=False, device=logits.device)


def test_sum_of_sample_mean_is_the_padded_masked_mean_summed() -> None:
    x = [[0.5, 100.0, -1.5], [2.0]]
    masks = [torch.tensor(m) for m in MASKS]
    got = sum_of_sample_mean(masks)(torch.tensor([v for row in x for v in row]))
    assert got.item() == pytest.approx((0.5 - 1.5) / 2 + 2.0)
    assert torch.equal(
        got, masked_sample_mean(_padded(x, 3), _padded([[float(v) for v in m] for m in MASKS], 3)).sum()
    )
    per_token = sum_of_sample_mean(masks, per_token=True)(torch.tensor([v for row in x for v in row]))
    assert per_token.item() == pytest.approx(0.5 - 1.5 + 2.0)
    with pytest.raises(ValueError, match=r"concatenated, \[4\]"):
        sum_of_sample_mean(masks)(torch.zeros(5))


def test_log_probs_and_entropy_read_rollflow_layout() -> None:
    logits = torch.randn(2, 3, 13, generator=torch.Generator().manual_seed(0))
    batch = _batch(logits, [1.0, -1.0], [[0.0] * 3, [0.0]])
    _, out = get_log_probs_and_entropy(
        logits,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
        with_entropy=True,
    )
    want_lp = log_probs_from_logits(logits, torch.tensor([RESPONSES[0], RESPONSES[1] + [0, 0]]))
    want_ent = entropy_from_logits(logits)
    assert [t.shape[0] for t in out["log_probs"]] == [3, 1]
    assert torch.equal(out["log_probs"][0], want_lp[0]) and torch.equal(out["log_probs"][1], want_lp[1, :1])
    assert torch.equal(out["entropy"][0], want_ent[0]) and torch.equal(out["entropy"][1], want_ent[1, :1])
    with pytest.raises(ValueError, match="B = 2 samples"):
        get_log_probs_and_entropy(logits[:1], unconcat_tokens=[], total_lengths=[], response_lengths=[1, 1])


def test_batch_has_slimes_keys_per_sample() -> None:
    batch = _batch(torch.zeros(2, 3, 13), [0.5, -2.0], [[-1.0, -2.0, -3.0], [-4.0]])
    assert batch["total_lengths"] == [6, 3] and batch["response_lengths"] == [3, 1]
    assert batch["unconcat_tokens"][1].tolist() == [5, 8, 12]
    assert [m.tolist() for m in batch["loss_masks"]] == MASKS
    assert [a.tolist() for a in batch["advantages"]] == [[0.5] * 3, [-2.0]]
    assert [a.tolist() for a in batch["returns"]] == [[0.5] * 3, [-2.0]]
    assert batch["log_probs"][0].tolist() == [-1.0, -2.0, -3.0] and batch["rewards"] == [1.0, 1.0]
    assert "ref_log_probs" not in batch and "rollout_log_probs" not in batch
    per_token = _batch(
        torch.zeros(2, 3, 13), [0.0, 0.0], [[0.0] * 3, [0.0]], adv=torch.tensor([[1, 2, 3], [4, 9, 9]])
    )
    assert [a.tolist() for a in per_token["advantages"]] == [[1.0, 2.0, 3.0], [4.0]]  # --kl-coef shaping


def test_sft_loss_is_the_masked_negative_log_likelihood() -> None:
    logits = torch.randn(2, 3, 13, generator=torch.Generator().manual_seed(1), requires_grad=True)
    batch = _batch(logits, [0.0, 0.0], [[0.0] * 3, [0.0]])
    loss, metrics = plugin_loss(sft_loss, "sft_loss", {}, batch, logits, normaliser=4.0)
    lp = torch.log_softmax(logits.detach(), -1)
    want = -((lp[0, 0, 9] + lp[0, 2, 11]) / 2 + lp[1, 0, 12]) / 4
    assert loss.item() == pytest.approx(want.item(), rel=1e-6) and metrics["loss"].item() == pytest.approx(
        want.item(), rel=1e-6
    )
    loss.backward()
    assert logits.grad is not None and logits.grad[0, 1].abs().sum() == 0  # the masked token has no gradient


def test_cispo_example_has_ppo_clips_gradient_on_policy() -> None:
    """At ratio 1 (the first step of a rollout) CISPO and PPO-clip have the same gradient: -A * grad log p."""
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(2, 3, 13, generator=gen)
    adv = [0.7, -1.3]
    old = log_probs_from_logits(base, torch.tensor([RESPONSES[0], RESPONSES[1] + [0, 0]]))
    batch = _batch(base, adv, [old[0].tolist(), old[1, :1].tolist()])
    args = {"eps_clip": 0.2, "eps_clip_high": None}

    mine = base.clone().requires_grad_()
    loss, metrics = plugin_loss(cispo_loss, "cispo", args, batch, mine, normaliser=2.0)
    loss.backward()
    assert set(metrics) == {"loss", "pg_loss", "ppo_kl", "cispo_clipfrac"} and metrics["ppo_kl"].item() == 0.0

    theirs = base.clone().requires_grad_()
    mask = _padded([[float(v) for v in m] for m in MASKS], 3)
    lp = log_probs_from_logits(theirs, torch.tensor([RESPONSES[0], RESPONSES[1] + [0, 0]]))
    ppo, _ = policy_objective(
        lp, old, torch.tensor(adv)[:, None].expand(2, 3), mask, torch.zeros(2, 3), eps_clip=0.2,
        eps_clip_high=0.2, normaliser=2.0,
    )  # fmt: skip
    ppo.backward()
    assert mine.grad is not None and theirs.grad is not None
    torch.testing.assert_close(mine.grad, theirs.grad)


def test_plugin_results_are_checked() -> None:
    logits = torch.zeros(2, 3, 13, requires_grad=True)
    batch = _batch(logits, [0.0, 0.0], [[0.0] * 3, [0.0]])
    cases = [
        (lambda *a: 1.5, r"my\.loss returned float; expected \(loss, metrics\)"),
        (lambda *a: (torch.tensor(1.0), {}), "expected a 0-dim tensor with grad"),
        (lambda *a: (logits.sum(-1), {}), r"a tensor of shape \(2, 3\) as its loss"),
        (lambda *a: (logits.sum(), [1.0]), "returned list as its metrics"),
        (lambda *a: (logits.sum(), {"kl": torch.zeros(2)}), r"metric 'kl' of shape \(2,\)"),
    ]
    for fn, message in cases:
        with pytest.raises(TypeError, match=message):
            plugin_loss(fn, "my.loss", {}, batch, logits, normaliser=1.0)
    loss, metrics = plugin_loss(
        lambda *a: (logits.sum() + 6.0, {"x": 3}), "ok", {}, batch, logits, normaliser=3.0
    )
    assert loss.item() == 2.0 and metrics == {"x": torch.tensor(1.0), "loss": torch.tensor(2.0)}


def test_loss_type_selects_the_function() -> None:
    assert resolve_loss("policy_loss", None) is None and resolve_loss("sft_loss", None) is sft_loss
    assert resolve_loss("custom_loss", "examples.custom_loss.cispo.cispo_loss") is cispo_loss
    with pytest.raises(ExtensionError, match="--custom-loss-function-path 'examples.nope.fn': cannot import"):
        resolve_loss("custom_loss", "examples.nope.fn")
    with pytest.raises(
        ExtensionError, match=r"get_log_probs_and_entropy\(logits.*cannot be called as slime calls a loss"
    ):
        resolve_loss("custom_loss", "trainers.custom_loss.get_log_probs_and_entropy")


def test_loss_config_refuses_half_a_custom_loss() -> None:
    with pytest.raises(ValueError, match="custom_loss needs --custom-loss-function-path"):
        LossConfig(loss_type="custom_loss")
    with pytest.raises(ValueError, match="add --loss-type custom_loss"):
        LossConfig(custom_loss_function_path="a.b")
    with pytest.raises(ValueError, match="value_loss"):
        LossConfig(loss_type="value_loss")  # type: ignore[arg-type]


def test_trainer_settings_carry_the_loss_and_the_flags() -> None:
    cfg = RunConfig.model_validate(
        {
            "loss": {
                "loss_type": "custom_loss",
                "custom_loss_function_path": "examples.custom_loss.cispo.cispo_loss",
            }
        }
    )
    s = trainer_settings(cfg)
    assert s.loss_type == "custom_loss" and s.custom_loss_function_path.endswith("cispo_loss")
    assert not s.fuse_first_step  # a plug-in needs the logits
    assert s.plugin_args["rollout_batch_size"] == cfg.rollout.rollout_batch_size
    assert s.plugin_args["eps_clip"] == cfg.train.eps_clip and s.plugin_args["loss_type"] == "custom_loss"
    assert trainer_settings(RunConfig()).fuse_first_step
