"""--ci-test's re-execution check: the trainer is deterministic by contract (a failed step is restored from its
step-boundary snapshot and retried, and the retry must train bitwise as the first attempt would have), so a
sample of each rollout's work is run again on the step-boundary weights (the snapshot's, before the step moves
them) and compared bit for bit: the first micro-batch's old-policy log-probs (against what the log-prob pass wrote)
and its train-step forward and backward (loss metrics and gradients, against the step as it runs them). The RNG
is left advanced, as for a retry. A difference names the stage, the rollout and the first value."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class NotDeterministic(AssertionError):
    """A re-execution from the step-boundary snapshot gave other bits than the run; `stage` is the one that
    differed ("log-prob" or "train-step")."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # crosses Ray as itself
        return NotDeterministic, (self.stage, str(self))


@dataclass(frozen=True)
class MicroRun:
    """What one micro-batch's forward and backward produced: its loss metrics and a fingerprint of each
    parameter's gradient (sum and absolute sum in float64: equal bits give equal sums)."""

    sample_indices: tuple[int, ...]
    metrics: dict[str, float]
    grads: tuple[tuple[float, float], ...]  # per parameter, in the trainer's parameter order


def micro_run(
    indices: list[int] | tuple[int, ...], metrics: dict[str, torch.Tensor], params: list[torch.nn.Parameter]
) -> MicroRun:
    """The record of a micro-batch whose backward just ran on gradients that were None before it."""
    grads = tuple(
        (0.0, 0.0) if p.grad is None else (float(p.grad.double().sum()), float(p.grad.double().abs().sum()))
        for p in params
    )
    return MicroRun(tuple(indices), {k: float(v) for k, v in metrics.items()}, grads)


def compare_log_probs(
    rollout_id: int, written: dict[int, list[float]], again: dict[int, list[float]]
) -> None:
    """NotDeterministic naming the first sample and token whose re-executed log-prob differs from the one the
    log-prob pass wrote (both float32 values)."""
    for index, values in again.items():
        for t, (a, b) in enumerate(zip(written[index], values, strict=True)):
            if a != b:
                raise NotDeterministic(
                    "log-prob",
                    f"log-prob is not deterministic: re-executing rollout {rollout_id}'s first micro-batch from its "
                    f"step-boundary snapshot gave log-prob {b!r} vs {a!r} (sample_index {index}, response token "
                    f"{t}) on the same weights and inputs",
                )


def compare_train(rollout_id: int, ran: MicroRun, again: MicroRun, names: list[str]) -> None:
    """NotDeterministic naming the first loss metric, else the first parameter's gradient, that differs between
    the train step as it ran (`ran`) and its re-execution from the snapshot (`again`)."""
    where = f"re-executing rollout {rollout_id}'s first micro-batch from its step-boundary snapshot gave"
    for key, value in ran.metrics.items():
        if again.metrics.get(key) != value:
            raise NotDeterministic(
                "train-step",
                f"train-step is not deterministic: {where} train/{key} {again.metrics.get(key)!r} vs {value!r}",
            )
    for name, a, b in zip(names, ran.grads, again.grads, strict=True):
        if a != b:
            raise NotDeterministic(
                "train-step",
                f"train-step is not deterministic: {where} the gradient of {name} (sum {b[0]!r} vs {a[0]!r}) "
                "with the same loss",
            )
