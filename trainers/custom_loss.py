"""slime's --loss-type sft_loss and custom_loss, shared by every trainer backend (policy_loss is
trainers/losses.policy_objective).

A loss is called as slime calls it, ``fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``:

- ``args``: the run's flags as attributes under slime's names (``args.rollout_temperature``,
  ``args.n_samples_per_prompt``, ...).
- ``batch``: one micro-batch, slime's keys, one entry per sample: ``unconcat_tokens`` (prompt + response token
  ids, int64 [L_i]), ``total_lengths`` and ``response_lengths`` (ints), ``loss_masks`` (int [R_i]),
  ``advantages`` and ``returns`` (the sample's advantage on each response token, float32 [R_i]), ``log_probs``
  (old policy, float32 [R_i]), and where the run has them ``ref_log_probs`` and ``rollout_log_probs``.
  rollflow adds ``rewards`` (floats).
- ``logits``: rollflow's layout, not slime's packed ``[1, sum L_i, V]``: ``[B, T, V]`` float32, row ``b``
  position ``t`` the distribution that predicted response token ``t`` of sample ``b``, already divided by
  --rollout-temperature, right padded to the longest response. :func:`get_log_probs_and_entropy` below takes
  slime's keyword arguments and reads this layout, so a slime loss ports by importing it from here.
- ``sum_of_sample_mean(x)``: ``x`` the samples' per-token values concatenated ([sum R_i]); the sum over samples
  of each one's mean over its loss-masked tokens (slime's reducer; with --calculate-per-token-loss the sum over
  loss tokens).

The returned loss (0-dim, with grad) and every metric (0-dim) are divided as the policy loss's are (by the global
batch size, or by the optimizer step's loss tokens with --calculate-per-token-loss), so their sum over
micro-batches and data-parallel ranks is the step's mean; metrics are logged as ``train/<key>``.
"""

from __future__ import annotations

import inspect
import math
from argparse import Namespace
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

LossFn = Callable[[Any, dict[str, Any], Tensor, Callable[[Tensor], Tensor]], Any]


class LossOutputError(TypeError):
    """A loss plug-in returned something other than (a 0-dim loss with grad, a dict of numbers)."""


def sum_of_sample_mean(loss_masks: list[Tensor], per_token: bool = False) -> Callable[[Tensor], Tensor]:
    """slime's reducer for samples with these loss masks ([R_i] each): ``x`` [sum R_i] -> the sum over samples of
    ``sum(x_i * mask_i) / max(sum(mask_i), 1)`` (0-dim); with `per_token` (--calculate-per-token-loss) the plain
    sum over loss tokens, as slime's sum_of_token."""
    lengths = [int(m.numel()) for m in loss_masks]

    def reduce(x: Tensor) -> Tensor:
        if x.dim() != 1 or x.numel() != sum(lengths):
            raise ValueError(
                f"sum_of_sample_mean expects the samples' per-token values concatenated, [{sum(lengths)}]; "
                f"got {tuple(x.shape)}"
            )
        total = x.new_zeros(())
        for part, mask in zip(x.split(lengths), loss_masks, strict=True):
            m = mask.to(part.dtype)
            total = total + ((part * m).sum() if per_token else (part * m).sum() / m.sum().clamp(min=1))
        return total

    return reduce


def get_log_probs_and_entropy(
    logits: Tensor,
    *,
    args: Any = None,
    unconcat_tokens: list[Tensor],
    total_lengths: list[int],
    response_lengths: list[int],
    with_entropy: bool = False,
) -> tuple[Tensor, dict[str, list[Tensor]]]:
    """slime's helper of the same name and keywords, on rollflow's logits layout (module docstring): each sample's
    response-token log-probs (and entropies), float32 [R_i] each, with grad. ``args`` is accepted for the same call
    and unused (the logits are already temperature-scaled). Returns ``(empty tensor, {"log_probs": [...],
    "entropy": [...]})`` as slime's does."""
    del args
    if logits.dim() != 3 or logits.shape[0] != len(response_lengths):
        raise ValueError(
            f"expected logits [B, T, V] with B = {len(response_lengths)} samples, got {tuple(logits.shape)}"
        )
    log_p = torch.log_softmax(logits.float(), dim=-1)
    out: dict[str, list[Tensor]] = {"log_probs": []}
    if with_entropy:
        out["entropy"] = []
    for b, (tokens, total, n) in enumerate(
        zip(unconcat_tokens, total_lengths, response_lengths, strict=True)
    ):
        response = tokens[total - n : total].to(logits.device).long()
        out["log_probs"].append(log_p[b, :n].gather(-1, response[:, None]).squeeze(-1))
        if with_entropy:
            lp = log_p[b, :n].clamp(min=torch.finfo(log_p.dtype).min)  # 0 * -inf would be NaN
            out["entropy"].append(-(lp.exp() * lp).sum(-1))
    return logits.new_empty((0,)), out


def sft_loss(
    args: Any, batch: dict[str, Any], logits: Tensor, sum_of_sample_mean: Callable[[Tensor], Tensor]
) -> tuple[Tensor, dict[str, Tensor]]:
    """slime's sft_loss: the negative log-likelihood of the response tokens, each sample's mean over its loss
    mask."""
    _, out = get_log_probs_and_entropy(
        logits,
        args=args,
        unconcat_tokens=batch["unconcat_tokens"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
    )
    loss = -sum_of_sample_mean(torch.cat(out["log_probs"]))
    return loss, {"loss": loss.detach()}


def resolve_loss(loss_type: str, custom_loss_function_path: str | None) -> LossFn | None:
    """The loss function of --loss-type (None for policy_loss, which trainers/losses.py computes)."""
    if loss_type == "policy_loss":
        return None
    if loss_type == "sft_loss":
        return sft_loss
    if loss_type == "custom_loss":
        if not custom_loss_function_path:
            raise ValueError("--loss-type custom_loss needs --custom-loss-function-path module.fn")
        from rollout.extensions import ExtensionError, load_function

        fn = load_function(custom_loss_function_path, "--custom-loss-function-path")
        try:
            inspect.signature(fn).bind(None, None, None, None)
        except TypeError:
            raise ExtensionError(
                f"--custom-loss-function-path {custom_loss_function_path!r}: {fn.__name__}"
                f"{inspect.signature(fn)} cannot be called as slime calls a loss, "
                "fn(args, batch, logits, sum_of_sample_mean)"
            ) from None
        except ValueError:  # no signature to read (a builtin or C function): it is called as it is
            pass
        return fn
    raise ValueError(f"--loss-type {loss_type!r}: expected policy_loss, sft_loss or custom_loss")


def build_batch(
    samples: list[Any],
    advantages: Tensor,
    old: dict[int, dict[str, Any]],
    *,
    use_rollout_lp: bool,
    device: torch.device,
) -> dict[str, Any]:
    """slime's micro-batch dict (module docstring) of `samples` (artifacts.schema.Sample rows). `advantages`: [B],
    one per sample, or [B, >= max R_i] per token; `old`: sample_index -> the log-prob row (``log_probs``, maybe ``ref_log_probs``)."""

    def floats(values: Any) -> Tensor:
        return torch.tensor(list(values), dtype=torch.float32, device=device)

    batch: dict[str, Any] = {
        "unconcat_tokens": [
            torch.tensor([*s.prompt_tokens, *s.response_tokens], dtype=torch.long, device=device)
            for s in samples
        ],
        "total_lengths": [len(s.prompt_tokens) + s.response_length for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": [torch.tensor(list(s.loss_mask), dtype=torch.int32, device=device) for s in samples],
        "advantages": [
            row[: s.response_length].to(device=device, dtype=torch.float32)
            if advantages.dim() == 2
            else torch.full((s.response_length,), float(row), dtype=torch.float32, device=device)
            for s, row in zip(samples, advantages, strict=True)
        ],
        "log_probs": [floats(old[s.sample_index]["log_probs"]) for s in samples],
        "rewards": [float(s.reward) for s in samples],
    }
    batch["returns"] = [
        a.clone() for a in batch["advantages"]
    ]  # slime's GRPO-family returns are the advantages
    if all(old[s.sample_index].get("ref_log_probs") is not None for s in samples):
        batch["ref_log_probs"] = [floats(old[s.sample_index]["ref_log_probs"]) for s in samples]
    if use_rollout_lp:
        batch["rollout_log_probs"] = [floats(s.rollout_log_probs) for s in samples]
    return batch


def plugin_loss(
    fn: LossFn,
    name: str,
    args: dict[str, Any],
    batch: dict[str, Any],
    logits: Tensor,
    normaliser: float,
    per_token: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Call `fn` (named `name` in errors) on one micro-batch and scale its loss and metrics by 1/`normaliser` (the
    global batch size, or with `per_token` the step's loss tokens: module docstring). A result that is not (a 0-dim
    tensor, a dict of numbers) is refused."""
    reduce = sum_of_sample_mean(batch["loss_masks"], per_token)
    result = fn(Namespace(**args), batch, logits, reduce)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise LossOutputError(f"{name} returned {type(result).__name__}; expected (loss, metrics)")
    loss, metrics = result
    if not (isinstance(loss, Tensor) and loss.dim() == 0 and loss.requires_grad):
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
        raise LossOutputError(
            f"{name} returned {what} as its loss; expected a 0-dim tensor with grad (computed from the logits)"
        )
    if not isinstance(metrics, dict):
        raise LossOutputError(
            f"{name} returned {type(metrics).__name__} as its metrics; expected a dict name -> value"
        )
    scaled: dict[str, Tensor] = {}
    for key, value in metrics.items():
        v = torch.as_tensor(value.detach() if isinstance(value, Tensor) else value, dtype=torch.float32)
        if not isinstance(key, str) or v.dim() != 0:
            raise LossOutputError(
                f"{name} returned metric {key!r} of shape {tuple(v.shape)}; expected a name -> number"
            )
        scaled[key] = v.cpu() / normaliser
    scaled.setdefault("loss", loss.detach().float().cpu() / normaliser)
    return loss / normaliser, scaled


def check_loss(
    fn: LossFn, name: str, args: dict[str, Any], *, per_token: bool = False, with_ref: bool = False
) -> str:
    """`rollflow run --dry-run`'s loss check: `fn` called as a trainer calls it (`build_batch`, `plugin_loss`,
    then backward) on a synthetic micro-batch of two samples with random logits; one line with its loss and metric
    names, or ValueError naming the loss, what it was called with and what went wrong (it raised, returned the
    wrong type, or gave no finite gradient to the logits). `with_ref`: the batch has ``ref_log_probs`` (the run
    computes them)."""
    from artifacts.schema import Sample as Row

    gen = torch.Generator().manual_seed(0)
    vocab, lengths = 8, (4, 3)
    rows = [
        Row(
            rollout_id=0,
            group_index=0,
            sample_index=i,
            prompt="p",
            prompt_tokens=[1, 2, 3],
            response="r",
            response_tokens=torch.randint(vocab, (n,), generator=gen).tolist(),
            response_length=n,
            label="",
            reward=float(i == 0),
            status="completed",
            loss_mask=[1] * (n - 1) + [0],  # a token out of the loss, as a tool's output is
            rollout_log_probs=[-1.0] * n,
            weight_version=0,
            seed=i,
        )
        for i, n in enumerate(lengths)
    ]
    old = {
        r.sample_index: {
            "log_probs": [-1.0] * r.response_length,
            **({"ref_log_probs": [-1.1] * r.response_length} if with_ref else {}),
        }
        for r in rows
    }
    batch = build_batch(rows, torch.tensor([0.5, -0.5]), old, use_rollout_lp=True, device=torch.device("cpu"))
    logits = torch.randn(len(rows), max(lengths), vocab, generator=gen).requires_grad_()
    called = (
        f"--custom-loss-function-path {name} called as a trainer calls it on a synthetic micro-batch of "
        f"{len(rows)} samples (response lengths {list(lengths)}, logits {list(logits.shape)} with grad"
        f"{', ref_log_probs' if with_ref else ''}{', per-token loss' if per_token else ''})"
    )
    try:
        loss, metrics = plugin_loss(fn, name, args, batch, logits, float(len(rows)), per_token)
    except LossOutputError as e:
        raise ValueError(f"{called}: {e}") from None
    except Exception as e:
        raise ValueError(f"{called}: raised {type(e).__name__}: {e}") from None
    try:
        loss.backward()
    except Exception as e:
        raise ValueError(f"{called}: backward through its loss raised {type(e).__name__}: {e}") from None
    value = float(loss.detach())
    if not math.isfinite(value):
        raise ValueError(f"{called}: returned the loss {value}, expected a finite number")
    if logits.grad is None or not bool(torch.isfinite(logits.grad).all()):
        what = "no gradient" if logits.grad is None else "a gradient that is not finite"
        raise ValueError(f"{called}: backward gave the logits {what}: the loss must be computed from them")
    return (
        f"loss check: {name} on a synthetic micro-batch of {len(rows)} samples: loss {value:.4g}, metrics "
        f"{sorted(metrics)}, backward gave the logits a gradient"
    )
