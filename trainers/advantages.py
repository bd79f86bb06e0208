"""Registered per-sample advantage estimators (slime / miles reward normalisation).

Every estimator has the same contract::

    fn(rewards: Tensor[B] float, group_index: Tensor[B] int64, *, normalize_std: bool = True) -> Tensor[B]

``rewards[i]`` is the scalar reward of sample ``i`` and ``group_index[i]`` the prompt group it was sampled
for. The result is one scalar advantage per sample, in the dtype of ``rewards``; the trainer broadcasts it
over the sample's response tokens (GRPO-style "advantage = return = normalised reward").

Groups are identified by value, not position: members of a group need not be contiguous, and each
group's result is computed from that group's members only (taken in their batch order), so interleaving
or reordering other groups never changes it. Everything is deterministic (plain per-group torch
reductions on CPU tensors, no atomics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

AdvantageEstimator = Callable[..., Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}

# Added to the group std before dividing, exactly as slime/miles do, so an all-equal group gives 0, not NaN.
GRPO_STD_EPS = 1e-6


def register_advantage(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator registering ``fn`` under ``name`` in :data:`ADVANTAGE_ESTIMATORS` (duplicates are an error)."""

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """Return the estimator registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def _check_inputs(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.dim() != 1 or group_index.dim() != 1 or rewards.shape != group_index.shape:
        raise ValueError(
            f"rewards and group_index must be 1-D of equal length, got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating tensor, got {rewards.dtype}")
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise TypeError(f"group_index must be an integer tensor, got {group_index.dtype}")


def _groups(group_index: Tensor) -> Iterator[Tensor]:
    """Yield, for each distinct group id (ascending), the positions of its members in batch order."""
    for gid in torch.unique(group_index):
        yield torch.nonzero(group_index == gid, as_tuple=True)[0]


def _per_group(rewards: Tensor, group_index: Tensor, rows_fn: Callable[[Tensor], Tensor]) -> Tensor:
    """``out[i]`` = what ``rows_fn`` gives sample ``i`` from its group's rewards.

    ``rows_fn`` maps rewards laid out as rows ``[G, k]`` (one group a row, its members in batch order) to
    per-member results ``[G, k]``, reducing along ``dim=1`` only. When every group has the same size (the
    ``--n-samples-per-prompt`` case) it runs once on all groups; otherwise once per group on a ``[1, n]`` row.
    A row reduces with the same kernel either way, so both give the same bits (tests/unit/test_advantages.py).
    The single call saves a few torch ops per group on every train step.
    """
    out = torch.empty_like(rewards)
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    if len(counts) and bool((counts == counts[0]).all()):
        order = torch.argsort(inverse, stable=True)  # groups ascending by id, members in batch order
        out[order] = rows_fn(rewards[order].view(len(counts), -1)).reshape(-1)
        return out
    for idx in _groups(group_index):
        out[idx] = rows_fn(rewards[idx][None])[0]
    return out


@register_advantage("grpo")
def grpo(rewards: Tensor, group_index: Tensor, *, normalize_std: bool = True) -> Tensor:
    """GRPO: ``(r - mean_g) / (std_g + 1e-6)`` per group ``g``.

    ``std_g`` is the unbiased std, ``sqrt(sum((r - mean_g)**2) / (n_g - 1))`` in float64. With
    ``normalize_std=False`` (slime ``--disable-grpo-std-normalization``) only the mean is subtracted. Groups of
    size 1 skip the std division (their unbiased std is undefined; slime disables it for
    ``n_samples_per_prompt == 1`` and miles applies it only to groups > 1), so they get advantage 0.

    Shapes: rewards [B] float, group_index [B] int -> [B] (rewards' dtype).
    """
    _check_inputs(rewards, group_index)

    def centre(rows: Tensor) -> Tensor:
        centred = rows - rows.mean(dim=1, keepdim=True)
        if normalize_std and rows.shape[1] > 1:
            # in float64, as torch.std computes a float32 row's (the same bits for these), but two-pass: torch.std's
            # float64 kernel rounds a row differently with more rows beside it
            wide = rows.double()
            dev = wide - wide.mean(dim=1, keepdim=True)
            std = ((dev * dev).sum(dim=1, keepdim=True) / (rows.shape[1] - 1)).sqrt().to(rows.dtype)
            centred = centred / (std + GRPO_STD_EPS)
        return centred

    return _per_group(rewards, group_index, centre)


@register_advantage("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(
    rewards: Tensor, group_index: Tensor, *, normalize_std: bool = True
) -> Tensor:
    """REINFORCE++-baseline: ``r - mean_g`` per group (never std-normalised).

    ``normalize_std`` is accepted for the uniform signature and ignored: slime only divides by the std for
    grpo/gspo; REINFORCE++ instead whitens advantages later across the whole batch (trainer side).

    Shapes: rewards [B] float, group_index [B] int -> [B].
    """
    del normalize_std
    _check_inputs(rewards, group_index)
    return _per_group(rewards, group_index, lambda rows: rows - rows.mean(dim=1, keepdim=True))


@register_advantage("rloo")
def rloo(rewards: Tensor, group_index: Tensor, *, normalize_std: bool = True) -> Tensor:
    """RLOO: ``r_i - mean(r_j for j != i in the group)``; a group of size 1 has no baseline and gives 0.

    ``normalize_std`` is accepted for the uniform signature and ignored.

    Shapes: rewards [B] float, group_index [B] int -> [B].
    """
    del normalize_std
    _check_inputs(rewards, group_index)

    def leave_one_out(rows: Tensor) -> Tensor:
        n = rows.shape[1]
        if n == 1:
            return torch.zeros_like(rows)  # no other members to form a baseline from
        return rows - (rows.sum(dim=1, keepdim=True) - rows) / (n - 1)

    return _per_group(rewards, group_index, leave_one_out)


def group_reward_stats(rewards: Tensor, group_index: Tensor) -> dict[str, float | int | dict[float, int]]:
    """Per-rollout group statistics for metrics (pure; does not modify its inputs).

    Returns:
        ``num_groups``: number of distinct group ids.
        ``zero_std_count``: groups whose rewards are all equal (zero advantage signal under GRPO); a group of
            size 1 counts as zero-std.
        ``zero_std_by_value``: ``{reward value: count}`` for those groups, the data behind slime's
            ``rollout/zero_std/count_<r>`` metric.
        ``mean_group_std``: mean over groups of size > 1 of the unbiased group std (0.0 if there are none).
    """
    _check_inputs(rewards, group_index)
    num_groups = 0
    zero_std_by_value: dict[float, int] = {}
    stds: list[float] = []
    for idx in _groups(group_index):
        num_groups += 1
        members = rewards[idx]
        if bool((members == members[0]).all()):
            value = float(members[0])
            zero_std_by_value[value] = zero_std_by_value.get(value, 0) + 1
        if members.numel() > 1:
            stds.append(float(members.std()))
    return {
        "num_groups": num_groups,
        "zero_std_count": sum(zero_std_by_value.values()),
        "zero_std_by_value": zero_std_by_value,
        "mean_group_std": sum(stds) / len(stds) if stds else 0.0,
    }


def advantages_of_valid(
    name: str, rewards: Tensor, group_index: Tensor, valid: Tensor, *, normalize_std: bool = True
) -> Tensor:
    """The estimator `name` over the valid samples only; an invalid sample (its reward raised) gets 0.

    An invalid sample's reward is not a score, so it stays out of its group's mean and std. A group whose
    valid members all scored the same gets zero advantages, whatever its failed members hold. slime masks
    such samples out of the loss but still counts their reward in the group statistics; we also leave them
    out of the statistics. All valid: exactly the estimator's result.

    Shapes: rewards [B] float, group_index [B] int, valid [B] bool -> [B] (rewards' dtype).
    """
    _check_inputs(rewards, group_index)
    if valid.shape != rewards.shape or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor of shape {tuple(rewards.shape)}")
    estimator = get_advantage_estimator(name)
    if bool(valid.all()):
        return estimator(rewards, group_index, normalize_std=normalize_std)
    out = torch.zeros_like(rewards)
    if bool(valid.any()):
        out[valid] = estimator(rewards[valid], group_index[valid], normalize_std=normalize_std)
    return out


# Added to the variance before the inverse square root, as slime's masked whitening does.
WHITEN_EPS = 1e-8


def whiten_weighted(values: Tensor, weights: Tensor) -> Tensor:
    """slime's ``--normalize-advantages``: ``(v - mean) / sqrt(var + 1e-8)`` with the mean and the unbiased
    variance taken over tokens, a value counting ``weights`` times (the number of loss tokens it covers).

    Per token (``weights`` = the 0/1 loss mask) this is slime's masked whitening; per sample (each sample's
    advantage with weight = its loss-mask sum) it gives what whitening the broadcast per-token advantages
    would. Statistics in float64; the result in ``values``' dtype. Every value is whitened, weight 0 too
    (slime whitens masked positions as well; the loss never reads them).

    Shapes: values [N] float, weights [N] (0/1 or counts) -> [N].
    """
    if values.shape != weights.shape or values.dim() != 1:
        raise ValueError(
            f"values and weights must be 1-D of equal length, got {tuple(values.shape)} and {tuple(weights.shape)}"
        )
    v, w = values.double(), weights.double()
    count = w.sum()
    if not count > 0:
        raise ValueError("--normalize-advantages: no loss token in the batch to take statistics over")
    mean = (v * w).sum() / count
    var = (v * v * w).sum() / count - mean * mean
    if count >= 2:
        var = var * count / (count - 1)  # Bessel's correction
    return ((v - mean) * torch.rsqrt(var + WHITEN_EPS)).to(values.dtype)
