"""Cutting the loop and asserting it: the debug knobs and the --ci-test harness (slime/miles names)."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field

from config.base import Section


class DebugConfig(Section):
    """Cutting the loop: rollout-only / train-only, record and replay (slime/miles flag names)."""

    debug_rollout_only: bool = Field(
        False, description="Generate and save rollouts only; no trainer is created."
    )
    debug_train_only: bool = Field(
        False, description="Train from recorded rollouts only; no engine is created."
    )
    save_debug_rollout_data: str | None = Field(
        None, description="Also write every rollout to TPL.format(rollout_id=...) (.parquet or slime .pt)."
    )
    load_debug_rollout_data: str | None = Field(
        None, description="Train from recordings at TPL (.parquet or .pt); implies --debug-train-only."
    )
    load_debug_rollout_data_subsample: float | None = Field(
        None, gt=0.0, le=1.0, description="Keep this fraction of each loaded rollout (head + tail rule)."
    )
    trust_pickle: bool = Field(False, description="Allow .pt recordings that need arbitrary unpickling.")
    dump_details: str | None = Field(
        None, description="Write rollout_data/{id} and train_data/{id}_{rank} under this directory."
    )
    save_debug_train_data: str | None = Field(
        None, description="Write each rank's training batch to TPL.format(rollout_id=..., rank=...)."
    )
    ci_inject_rollout_data_path: str | None = Field(
        None,
        description="From the start id on, train on these recordings and compare fresh generations to them.",
    )
    ci_inject_rollout_data_start_rollout_id: int = Field(0, ge=0, description="First rollout id injected.")
    ci_inject_rollout_data_min_match_ratio: float = Field(
        0.9, ge=0.0, le=1.0, description="Mean response-token match ratio that fresh generations must exceed."
    )
    debug_skip_weight_update: bool = Field(
        False, description="Keep the release/resume schedule of the sync but skip the weight transfer itself."
    )
    debug_disable_optimizer: bool = Field(
        False,
        description="Build no optimizer or LR scheduler; forward/backward still run, weights never change.",
    )
    debug_exit_after_rollout: int | None = Field(
        None, ge=1, description="End cleanly after this many rollouts of this run (for resume tests)."
    )
    debug_deterministic_collective: bool = Field(
        False,
        description="Sum reductions by all-gather + fixed-order fold: bitwise across DP topologies (slow).",
    )
    debug_separate_logprob_pass: bool = Field(
        False,
        description="Compute the old-policy log-probs in a forward of their own, not in the first train step's "
        "forward (the default outside --ci-test); training is bitwise the same either way.",
    )
    allow_model_dropout: bool = Field(
        False,
        description="Train a model whose config.json turns dropout on (refused otherwise: RL trainers run without "
        "it); the torch trainer then takes its plain forward in every batch layout. The megatron backend refuses it.",
    )
    load_forge_rollout_data: str | None = Field(
        None, description="Replay recordings while engines stay alive and weights keep syncing."
    )


class CIConfig(Section):
    """The --ci-test assertion harness (miles' checkers), each with its escape hatch."""

    ci_test: bool = Field(False, description="Turn on the in-process checkers below.")
    ci_disable_kl_checker: bool = Field(False, description="Skip the step-0 KL / clipfrac / kl_loss checks.")
    ci_disable_logprobs_checker: bool = Field(False, description="Skip the log-prob / entropy checks.")
    ci_disable_weight_update_checker: bool = Field(False, description="Skip the first-sync weight check.")
    ci_disable_reexecution_checker: bool = Field(
        False,
        description="Skip re-executing each rollout's first micro-batch (log-prob pass and train step) from its "
        "step-boundary snapshot and re-generating a few requests on the torch engine, each compared bit for bit "
        "with the run.",
    )
    check_weight_update_equal: bool = Field(
        False,
        description="Scramble engine weights, sync once, require every tensor bitwise equal (also without --ci-test).",
    )
    check_weight_update_skip_list: str | None = Field(
        None, description="Comma-separated weight names the weight-update check ignores."
    )
    ci_logprobs_checker_abs_tol: float | None = Field(
        None,
        gt=0.0,
        description="Trainer vs engine log-prob tolerance (of the rollout means); None = the run's precision's: "
        "0.03 for fp32 (miles'), wider for bf16 (config/precision.py).",
    )
    ci_entropy_max: float = Field(0.7, gt=0.0, description="Upper bound of rollout/entropy (miles: 0.7).")
    ci_metric_checker_key: str | None = Field(None, description="Eval metric the accuracy gate reads.")
    ci_metric_checker_threshold: float | None = Field(
        None, description="The gate passes when key >= threshold."
    )
    ci_metric_checker_expect_num: int | None = Field(
        None, ge=1, description="Require exactly N evals, all passing (default: at least one passing)."
    )
    ci_save_grad_norm: str | None = Field(
        None, description="Write grad norms to TPL ({role}, {rollout_id}, {step_id})."
    )
    ci_load_grad_norm: str | None = Field(None, description="Compare grad norms with TPL (rel = abs = 0.03).")
    ci_doctor: Literal["gate", "advisory"] = Field(
        "gate",
        description="With --ci-test, the doctor runs on the run dir at the end: `gate` fails the run on an ERROR "
        "finding (the finding is the run's failure), `advisory` only reports the findings.",
    )
    ci_fault_drop_weight: str | None = Field(
        None,
        description="Fault injection: engines silently skip these tensors on every weight update: "
        "comma-separated names or globs (model.layers.*.mlp.up_proj.weight).",
    )

    @property
    def weight_check(self) -> bool:
        return self.check_weight_update_equal or (self.ci_test and not self.ci_disable_weight_update_checker)


RECORDING_FORMATS = (".parquet", ".pt")


def check_template(flag: str, template: str | None, *, need_id: bool, extra: tuple[str, ...] = ()) -> None:
    if template is None:
        return
    fields = ", ".join(("rollout_id",) + extra)
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        for rid in ("0", "eval_0"):  # ids are formatted as strings at run time, so specs like :06d fail here
            template.format(rollout_id=rid, **{k: "0" for k in extra})
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"{flag} {template!r}: bad template ({e}); fields: {fields}") from None
    if need_id and "rollout_id" not in names:
        raise ValueError(
            f"{flag} {template!r} has no {{rollout_id}}: a literal path would be overwritten "
            f"by every rollout; use e.g. /tmp/rollout_{{rollout_id}}.parquet"
        )
    if not template.endswith(RECORDING_FORMATS):
        raise ValueError(
            f"{flag} {template!r}: the extension picks the format; use one of {RECORDING_FORMATS}"
        )


def check_debug(d: DebugConfig) -> None:
    """The anchors' validation order: load implies train-only, then the mutual exclusions."""
    train_only = d.debug_train_only or d.load_debug_rollout_data is not None
    if train_only and d.debug_rollout_only:
        why = (
            "--load-debug-rollout-data (implies --debug-train-only)"
            if d.load_debug_rollout_data
            else "--debug-train-only"
        )
        raise ValueError(f"--debug-rollout-only and {why} are mutually exclusive")
    if d.load_debug_rollout_data_subsample is not None and d.load_debug_rollout_data is None:
        raise ValueError("--load-debug-rollout-data-subsample needs --load-debug-rollout-data")
    if d.ci_inject_rollout_data_path and train_only:
        raise ValueError(
            "--ci-inject-rollout-data-path compares fresh generations, so it needs engines: "
            "drop --debug-train-only / --load-debug-rollout-data"
        )
    if d.ci_inject_rollout_data_path and d.debug_rollout_only:
        raise ValueError(
            "--ci-inject-rollout-data-path feeds training, so it cannot run with --debug-rollout-only"
        )
    if d.load_forge_rollout_data and (train_only or d.debug_rollout_only):
        raise ValueError(
            "--load-forge-rollout-data keeps engines and trainer running: it cannot be combined "
            "with --debug-train-only, --debug-rollout-only or --load-debug-rollout-data"
        )
    if d.load_forge_rollout_data and d.ci_inject_rollout_data_path:
        raise ValueError("--load-forge-rollout-data and --ci-inject-rollout-data-path are mutually exclusive")
    check_template("--save-debug-rollout-data", d.save_debug_rollout_data, need_id=True)
    check_template("--save-debug-train-data", d.save_debug_train_data, need_id=True, extra=("rank",))
    check_template("--ci-inject-rollout-data-path", d.ci_inject_rollout_data_path, need_id=True)
    check_template("--load-debug-rollout-data", d.load_debug_rollout_data, need_id=False)
    check_template("--load-forge-rollout-data", d.load_forge_rollout_data, need_id=False)
    if d.save_debug_rollout_data and d.save_debug_rollout_data == d.save_debug_train_data:
        raise ValueError("--save-debug-rollout-data and --save-debug-train-data must differ")
