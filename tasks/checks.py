"""The --ci-test checkers (miles' semantics and tolerances), as pure functions over logged metrics.

Each returns a list of violations; the `check` task (or the run flow, for the accuracy gate) raises
`CheckFailed` with all of them, naming checker, metric, value, tolerance, rollout and step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.hashing import differing_tensors, group_by_layer
from config import RunConfig


class CheckFailed(AssertionError):
    """An invariant of the run does not hold."""


# the --ci-test re-execution check's records, by the stage it re-executed (trainers/determinism.py)
REEXECUTION_CHECKS = {
    "log-prob": "check/log_prob_deterministic",
    "train-step": "check/train_step_deterministic",
    "generate": "check/generate_deterministic",  # engines/regenerate.py
}


def retry_unless_check_failed(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's `retry_condition_fn`. A checker failure is deterministic: the same inputs fail the same way.
    So it is reported once, not retried; so are the inject guard's mismatch and the re-execution check's. Any
    other failure may be retried."""
    from engines.regenerate import NotReproduced
    from rollout.replay import InjectionMismatch
    from trainers.determinism import NotDeterministic

    return not isinstance(state.data, CheckFailed | InjectionMismatch | NotDeterministic | NotReproduced)


@dataclass(frozen=True)
class Violation:
    checker: str
    metric: str
    value: float | str
    tolerance: str
    rollout_id: int | None = None
    step: int | None = None

    def __str__(self) -> str:
        where = "".join(
            [
                f" at rollout {self.rollout_id}" if self.rollout_id is not None else "",
                f" step {self.step}" if self.step is not None else "",
            ]
        )
        return f"[{self.checker} checker] {self.metric} = {self.value} violates {self.tolerance}{where}"


def kl_checker(
    steps: list[dict[str, Any]], rollout_id: int, first_step_of_run: int | None, recomputed_old: bool = True
) -> list[Violation]:
    """First step of the rollout: |ppo_kl| < 1e-9 and |pg_clipfrac| < 1e-10; first step of the run:
    |kl_loss| < 1e-9 (old == new == reference weights there). With `recomputed_old=False`
    (--use-rollout-logprobs: the old log-probs are the engine's) ratio == 1 does not hold at the first
    step, so only the kl_loss check applies."""
    if not steps:
        return []
    first, out = steps[0], []
    step = int(first["train/step"])
    if recomputed_old and abs(first.get("train/ppo_kl", 0.0)) >= 1e-9:
        out.append(Violation("KL", "train/ppo_kl", first["train/ppo_kl"], "|x| < 1e-9", rollout_id, step))
    if recomputed_old and abs(first.get("train/pg_clipfrac", 0.0)) >= 1e-10:
        out.append(
            Violation("KL", "train/pg_clipfrac", first["train/pg_clipfrac"], "|x| < 1e-10", rollout_id, step)
        )
    if step == first_step_of_run and "train/kl_loss" in first and abs(first["train/kl_loss"]) >= 1e-9:
        out.append(
            Violation(
                "KL",
                "train/kl_loss",
                first["train/kl_loss"],
                "|x| < 1e-9 at the first step",
                rollout_id,
                step,
            )
        )
    return out


def logprob_checker(
    stats: dict[str, float], rollout_id: int, first_rollout: bool, abs_tol: float, entropy_max: float
) -> list[Violation]:
    """Rollout 0: trainer log-probs == reference log-probs within 1e-8; every rollout: trainer vs engine
    log-probs within `abs_tol`, and 0 < entropy < `entropy_max`."""
    out = []
    lp, ref, eng, ent = (
        stats.get(k)
        for k in (
            "rollout/log_probs",
            "rollout/ref_log_probs",
            "rollout/rollout_log_probs",
            "rollout/entropy",
        )
    )
    if first_rollout and lp is not None and ref is not None and abs(lp - ref) >= 1e-8:
        out.append(
            Violation(
                "log-probs", "rollout/log_probs - rollout/ref_log_probs", lp - ref, "|x| < 1e-8", rollout_id
            )
        )
    if lp is not None and eng is not None and abs(lp - eng) >= abs_tol:
        out.append(
            Violation(
                "log-probs",
                "rollout/log_probs - rollout/rollout_log_probs",
                lp - eng,
                f"|x| < {abs_tol}",
                rollout_id,
            )
        )
    if ent is not None and not 0.0 < ent < entropy_max:
        out.append(Violation("log-probs", "rollout/entropy", ent, f"0 < x < {entropy_max}", rollout_id))
    return out


def grad_norm_checker(cfg: RunConfig, steps: list[dict[str, Any]], rollout_id: int) -> list[Violation]:
    """--ci-save-grad-norm writes each step's grad norm; --ci-load-grad-norm compares (rel = abs = 0.03)."""
    ci, out = cfg.ci, []
    for m in steps:
        step_id = int(m["train/step"])
        fields: dict[str, Any] = {"role": "actor", "rollout_id": rollout_id, "step_id": step_id}
        value = float(m["train/grad_norm"])
        if ci.ci_save_grad_norm:
            path = Path(ci.ci_save_grad_norm.format(**fields))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"grad_norm": value}))
        elif ci.ci_load_grad_norm:  # saving wins over loading, as in miles
            path = Path(ci.ci_load_grad_norm.format(**fields))
            if not path.is_file():
                out.append(
                    Violation(
                        "grad-norm", "train/grad_norm", value, f"a recording at {path}", rollout_id, step_id
                    )
                )
                continue
            expected = float(json.loads(path.read_text())["grad_norm"])
            if not math.isclose(value, expected, rel_tol=0.03, abs_tol=0.03):
                out.append(
                    Violation(
                        "grad-norm",
                        "train/grad_norm",
                        value,
                        f"isclose to recorded {expected} (rel = abs = 0.03)",
                        rollout_id,
                        step_id,
                    )
                )
    return out


def metric_gate(cfg: RunConfig, evals: list[dict[str, Any]]) -> list[Violation]:
    """End of run: at least one eval with key >= threshold, or exactly N evals all passing; no eval fails."""
    ci = cfg.ci
    if ci.ci_metric_checker_key is None or ci.ci_metric_checker_threshold is None:
        return []
    key, threshold = ci.ci_metric_checker_key, ci.ci_metric_checker_threshold
    values = [(r["rollout_id"], r["metrics"].get(key)) for r in evals]
    if not values:
        return [Violation("metric", key, "no eval ran", f">= {threshold} in at least one eval")]
    passing = [v is not None and v >= threshold for _, v in values]
    if ci.ci_metric_checker_expect_num is not None:
        if len(values) != ci.ci_metric_checker_expect_num or not all(passing):
            return [
                Violation(
                    "metric",
                    key,
                    str(values),
                    f"exactly {ci.ci_metric_checker_expect_num} evals, all >= {threshold}",
                )
            ]
        return []
    if not any(passing):
        return [Violation("metric", key, str(values), f">= {threshold} in at least one eval")]
    return []


def tensors_by_layer(names: list[str]) -> str:
    """Every name, grouped by layer: `layer_0000: a, b; layer_0001: c; non_layer: d`. All of them, not the first
    few: a bug that touches many tensors shows which layers (e.g. every other one, the last pipeline stage)."""
    return "; ".join(f"{layer}: {', '.join(group)}" for layer, group in group_by_layer(names).items())


def weight_update_failure(engine_index: int, names: list[str]) -> str:
    """The weight-update checker's line for one engine whose tensors `names` differ after the first sync."""
    layers = group_by_layer(names)
    return (
        f"[weight-update checker] engine {engine_index}: {len(names)} tensor(s) differ from the trainer's after "
        f"the first sync (tolerance: bitwise equal), in {len(layers)} layer group(s): {tensors_by_layer(names)}"
    )


@dataclass(frozen=True)
class EngineWeights:
    """What one engine reports it holds after a sync: its weight version and weights sha256, and (asked for only
    when they are wrong) its per-tensor hashes."""

    index: int
    version: int
    sha256: str
    tensor_hashes: dict[str, str] | None = None


def out_of_sync_message(
    rollout_id: int,
    version: int,
    sha256: str,
    wrong: list[EngineWeights],
    trainer_hashes: dict[str, str] | None,
    previous_sha256: str | None = None,
    run_dir: str = "RUN_DIR",
) -> str:
    """Why engines fail the engines-in-sync check after rollout `rollout_id`'s sync to (`version`, `sha256`).
    Per engine: the version it holds, both weights hashes, and the tensors whose content differs from the
    trainer's (the first one, then all of them by layer). So the message names the broken part. An engine
    whose weights still hash to `previous_sha256` (what the engines held before this sync) is named stale
    first."""
    parts = []
    stale = [e for e in wrong if previous_sha256 and e.sha256 == previous_sha256 != sha256]
    for e in stale:
        parts.append(
            f"engine {e.index}: stale: holds the weights of version {version - 1} (a transfer that did not apply"
            + (f"; it reports version {e.version})" if e.version != version - 1 else ")")
        )
    confirm = (
        f"; confirm: rollflow replay {run_dir} --rollout-id {rollout_id} --task sync pushes this rollout's weights "
        "again and compares the engine's with them, the checkpoints of --save-interval 1 given"
        if stale
        else " (check the weight transfer: --check-weight-update-equal)"
    )
    for e in (e for e in wrong if e not in stale):
        what = [
            f"engine {e.index}: holds weight version {e.version}"
            + (
                f" (expected {version}: the sync did not reach it)"
                if e.version != version
                else " as expected"
            )
        ]
        if e.sha256 != sha256:
            what.append(f"but its weights hash to {e.sha256}, the trainer's to {sha256}")
            if e.tensor_hashes is not None and trainer_hashes is not None:
                names = differing_tensors(trainer_hashes, e.tensor_hashes)
                if names:
                    what.append(
                        f"first differing tensor {names[0]}; {len(names)} tensor(s) differ: "
                        f"{tensors_by_layer(names)}"
                    )
        parts.append(" ".join(what))
    return (
        f"rollout {rollout_id}: engines {[e.index for e in wrong]} do not hold the trainer's weights after "
        f"the sync: " + "; ".join(parts) + confirm
    )


def raise_if_any(violations: list[Violation]) -> None:
    if violations:
        raise CheckFailed("; ".join(str(v) for v in violations))
