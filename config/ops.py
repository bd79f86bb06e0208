"""Operating a run: fault hooks and survival, and experiment trackers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from config.base import Section


class FaultConfig(Section):
    """Fault hooks (miles' request model) and what the run does to survive faults."""

    ci_fault_hooks: str | None = Field(
        None,
        description="JSON list of fault hook requests (request_id, hook_name, action {kind, ...}, target, "
        "rollout_id, attempt, weight_version, delay_ms, lifetime_seconds).",
    )
    ci_fault_hooks_path: str | None = Field(
        None, description="A file holding the same JSON as --ci-fault-hooks."
    )
    task_retries: int = Field(
        2,
        ge=0,
        le=20,
        description="Prefect retries of a failed stage (not of a checker failure, which is deterministic).",
    )
    task_retry_delay: float = Field(1.0, ge=0, le=600, description="Seconds between a stage's attempts.")
    rollout_timeout: float | None = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Seconds an engine may take for one generate/eval call before it is "
        "killed, restarted and the stage retried; None = no limit.",
    )
    train_timeout: float | None = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="Seconds the trainers may take for one stage (log-prob, train-step, "
        "save) before they are restarted from their snapshot; None = no limit.",
    )
    update_weights_timeout: float | None = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Seconds a weight sync may take before its actors are restarted; None = no limit.",
    )
    prefect_timeout: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Fail the run, with a message, when the Prefect "
        "API has not answered for this many seconds.",
    )

    @model_validator(mode="after")
    def _hooks_parse(self) -> FaultConfig:
        if self.ci_fault_hooks is None and self.ci_fault_hooks_path is None:
            return self  # nothing to parse (and faults.models need not be loaded for the default)
        from faults.models import parse_requests

        parse_requests(self.ci_fault_hooks, self.ci_fault_hooks_path)
        return self

    def check_targets(self, *, engines: int, trainer_ranks: int) -> None:
        """Every request's target is a process the run has: engine `i` < `engines`, trainer rank `r` <
        `trainer_ranks` (a target past them would never fire, and the run would pass without its fault)."""
        if self.ci_fault_hooks is None and self.ci_fault_hooks_path is None:
            return
        flag = "--ci-fault-hooks" if self.ci_fault_hooks is not None else "--ci-fault-hooks-path"
        has = {
            "engine": (engines, "--rollout-num-engines", "train-only"),
            "trainer rank": (
                trainer_ranks,
                "--tensor-model-parallel-size x --data-parallel-size",
                "rollout-only",
            ),
        }
        for r in self.requests():
            if r.target is None:
                continue
            kind = "engine" if r.target.engine is not None else "trainer rank"
            index = r.target.engine if r.target.engine is not None else r.target.trainer_rank
            count, source, mode = has[kind]
            if index is not None and index >= count:
                raise ValueError(
                    f"{flag}: request {r.request_id!r} targets {kind} {index}, but the run has {count} {kind}(s) "
                    + (f"({source})" if count else f"(none in {mode} mode)")
                )

    def requests(self) -> list[Any]:
        """The parsed fault hook requests."""
        from faults.models import parse_requests

        return parse_requests(self.ci_fault_hooks, self.ci_fault_hooks_path)


WandbMode = Literal["online", "offline", "disabled"]


class LoggingConfig(Section):
    """Experiment trackers (slime's flags and step keys): W&B and TensorBoard, each an optional extra.

    Every record of metrics.jsonl except `check` records also goes to each tracker turned on, with
    slime's step keys: rollout and perf records at `rollout/step` = rollout id, train steps at
    `train/step`, evals at `eval/step`."""

    use_wandb: bool = Field(False, description="Log metrics to Weights & Biases (needs the wandb extra).")
    wandb_project: str | None = Field(None, description="W&B project; None = W&B's default.")
    wandb_team: str | None = Field(None, description="W&B entity (team or user); None = your default entity.")
    wandb_group: str | None = Field(
        None, description="W&B group that gathers related runs; the W&B run itself is named --name."
    )
    wandb_host: str | None = Field(
        None,
        description="W&B server to log in to with --wandb-key (slime's wandb.login host, e.g. a self-hosted W&B), "
        "when W&B runs online; None = W&B's default. (--wandb-key sets WANDB_API_KEY for the run and is never "
        "written to config.yaml.)",
    )
    wandb_mode: WandbMode | None = Field(
        None,
        description="online, offline (written locally, `wandb sync` uploads it later) or disabled; "
        "None = the WANDB_MODE environment variable, else online.",
    )
    wandb_dir: str | None = Field(
        None,
        description="Directory W&B writes its files under (DIR/wandb/...); None = the working directory.",
    )
    use_tensorboard: bool = Field(
        False, description="Write TensorBoard event files (needs the tensorboard extra)."
    )
    tb_project_name: str | None = Field(
        None,
        description="TensorBoard logs go to tensorboard_log/<project>/<experiment> (or $TENSORBOARD_DIR); "
        "--use-tensorboard needs this or TENSORBOARD_DIR, as in slime.",
    )
    tb_experiment_name: str | None = Field(
        None, description="TensorBoard experiment; None = the start time (YYYYmmdd_HHMMSS), as in slime."
    )
