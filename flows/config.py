"""Typed run configuration: one frozen pydantic model per concern.

The same models are the flow's parameters (Prefect renders them as forms), the YAML file
format (`--config FILE.yaml`, nested by concern) and the CLI flags (`flows/cli.py` derives one
flag per field: `rollout_batch_size` -> `--rollout-batch-size`, slime's names where one exists).
Defaults live here and nowhere else. They are the default run's (tiny-arith, GRPO): the batch
shape, learning rate and schedule were chosen by measurement with `bench/learning.py`.
"""

from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engines.registry import ENGINES
from trainers.registry import TRAINERS

# Backend choices are the registries' keys (a backend that is not registered is refused at parse time).
RolloutBackend = Literal[tuple(ENGINES)]  # type: ignore[valid-type]
TrainBackend = Literal[tuple(TRAINERS)]  # type: ignore[valid-type]


class _Section(BaseModel):
    # allow_inf_nan=False: `--lr inf` or `--rollout-temperature nan` is a typo, never a setting
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class RolloutConfig(_Section):
    """What to generate each rollout and how to sample it."""

    num_rollout: int = Field(100, ge=1, le=10_000_000, description="Number of rollouts (RL iterations) in the run.")
    rollout_batch_size: int = Field(128, ge=1, le=1_000_000, description="Prompts per rollout.")
    n_samples_per_prompt: int = Field(4, ge=1, le=65_536, description="Responses sampled per prompt (the GRPO group size).")
    rollout_max_response_len: int = Field(6, ge=1, le=10_000_000, description="Max new tokens per response.")
    rollout_temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    rollout_top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    rollout_top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 disables it.")
    rollout_seed: int = Field(42, description="Seed of the prompt order and of every per-sample sampling seed.")
    rollout_stop: list[str] | None = Field(
        None, description="Stop strings: one that is a single token of the tokenizer becomes a stop token id, a "
                          "longer one ends the response where the decoded text first contains it.")
    rollout_stop_token_ids: list[int] | None = Field(
        None, description="Stop token ids, added to the defaults (the tokenizer's EOS and the chat template's "
                          "end-of-turn token).")
    rollout_backend: RolloutBackend = Field("torch", description="Inference engine backend.")  # type: ignore[valid-type]
    rollout_num_engines: int = Field(1, ge=1, le=4096, description="Engine actors; prompt groups are spread over them.")


class EvalConfig(_Section):
    """Held-out evaluation."""

    eval_interval: int | None = Field(
        10, ge=1, description="Evaluate every N rollouts (and at rollout 0 and after the last); None disables eval."
    )
    n_samples_per_eval_prompt: int = Field(
        4, ge=1, description="Samples per eval prompt (slime's default is 1; 4 keeps tiny-arith's eval noise near "
                             "one point).")
    eval_temperature: float | None = Field(None, gt=0.0, description="Eval sampling temperature; None = rollout's.")
    eval_top_p: float | None = Field(None, gt=0.0, le=1.0, description="Eval nucleus mass; None = rollout's.")
    eval_top_k: int | None = Field(None, ge=-1, description="Eval top-k; None = rollout's.")
    eval_max_response_len: int | None = Field(None, ge=1, description="Eval max new tokens; None = rollout's.")


class DataConfig(_Section):
    """Prompt data (slime's flags and meanings). Unset, the recipe supplies data, keys and eval set."""

    prompt_data: str | None = Field(
        None, description="Training prompts: a .jsonl or .parquet file, one row per prompt; None = the recipe's.")
    input_key: str = Field("input", description="Row key of the prompt: a string, or chat messages "
                                                "[{role, content}] (those need --apply-chat-template).")
    label_key: str | None = Field(None, description="Row key of the label handed to the reward.")
    metadata_key: str = Field("metadata", description="Row key of a JSON object carried into each sample's "
                                                      "metadata and handed to the reward.")
    tool_key: str = Field("tools", description="Row key of tool schemas passed to the chat template (if present).")
    apply_chat_template: bool = Field(False, description="Render the prompt with the tokenizer's chat template "
                                                         "(a string input becomes one user message).")
    apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of extra keyword arguments for the chat template.")
    rollout_shuffle: bool = Field(
        False, description="Visit prompts in a per-epoch permutation seeded by --rollout-seed + epoch (else file "
                           "order); the tiny-arith preset turns it on.")
    rollout_max_prompt_len: int | None = Field(
        None, ge=1, description="Drop prompts longer than this many tokens at load (the count is logged).")
    eval_prompt_data: list[str] | None = Field(
        None, description="NAME PATH [NAME PATH ...]: eval datasets, each logged as eval/NAME; None = the recipe's "
                          "(when it supplies the training data too).")
    eval_input_key: str | None = Field(None, description="Eval row key of the prompt; None = --input-key.")
    eval_label_key: str | None = Field(None, description="Eval row key of the label; None = --label-key.")

    @field_validator("eval_prompt_data")
    @classmethod
    def _pairs(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value or len(value) % 2:
            raise ValueError(f"expected NAME PATH pairs, got {len(value)} value(s): {value}")
        names = value[0::2]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate eval dataset name(s) {dup}: each NAME is logged as eval/NAME")
        bad = [n for n in names if not n or "/" in n]
        if bad:
            raise ValueError(f"eval dataset names must be non-empty and contain no '/': {bad}")
        return value

    @property
    def eval_datasets(self) -> list[tuple[str, str]]:
        """(name, path) of every eval dataset."""
        v = self.eval_prompt_data or []
        return list(zip(v[0::2], v[1::2], strict=True))


class RewardConfig(_Section):
    """How a response is scored (slime's flags): a built-in --rm-type or your --custom-rm-path."""

    rm_type: str | None = Field(
        None, description="Built-in reward (exact_match, math, deepscaler, f1, tiny-arith; a boxed_ prefix scores the last "
                          "\\boxed{...}); None = the recipe's when it supplies the data.")
    custom_rm_path: str | None = Field(
        None, description="Dotted path module.fn of your reward (sync or async), importable from the working "
                          "directory or PYTHONPATH; wins over --rm-type.")
    reward_key: str | None = Field(None, description="When the reward returns a dict: the key of the scalar reward.")
    eval_reward_key: str | None = Field(None, description="--reward-key for eval; None = --reward-key.")


class TrainConfig(_Section):
    """The trainer: batch schedule, optimiser and the RL loss."""

    train_backend: TrainBackend = Field("torch", description="Trainer backend.")  # type: ignore[valid-type]
    data_parallel_size: int = Field(1, ge=1, le=65_536, description="Data-parallel trainer ranks (gloo on CPU); the trainer "
                                                         "actors are tensor x data parallel, one rank each.")
    tensor_model_parallel_size: int = Field(
        1, ge=1, description="Tensor-parallel ranks per model replica (megatron backend only).")
    pipeline_model_parallel_size: int = Field(
        1, ge=1, description="Pipeline-parallel stages; only 1 is supported so far (refused otherwise).")
    context_parallel_size: int = Field(
        1, ge=1, description="Context-parallel ranks; only 1 is supported so far (refused otherwise).")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism; not supported yet (refused).")
    global_batch_size: int | None = Field(
        128, ge=1, description="Samples per optimizer step; None = the whole rollout (one step per rollout)."
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Samples per forward/backward on one rank; None = the rank's share of the step."
    )
    lr: float = Field(2e-4, gt=0.0, description="Peak learning rate (AdamW).")
    lr_decay_style: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description="LR schedule (decays to --min-lr over the run's optimizer steps).")
    lr_warmup_iters: int = Field(0, ge=0, description="Optimizer steps of linear warm-up.")
    min_lr: float = Field(0.0, ge=0.0, description="Floor of the decayed LR.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    clip_grad: float = Field(1.0, ge=0.0, description="Max global grad norm; 0 disables clipping.")
    advantage_estimator: Literal["grpo", "reinforce_plus_plus_baseline", "rloo"] = Field(
        "grpo", description="How rewards become advantages."
    )
    disable_grpo_std_normalization: bool = Field(False, description="GRPO: subtract the group mean only.")
    policy_loss: Literal["ppo_clip", "vanilla_pg"] = Field("ppo_clip", description="Policy-gradient loss.")
    eps_clip: float = Field(0.2, gt=0.0, description="PPO lower clip range.")
    eps_clip_high: float | None = Field(None, gt=0.0, description="PPO upper clip range; None = eps_clip.")
    eps_clip_c: float | None = Field(None, gt=1.0, description="Dual-clip constant (> 1); None disables it.")
    entropy_coef: float = Field(0.0, ge=0.0, description="Weight of the entropy bonus.")
    use_kl_loss: bool = Field(False, description="Add a KL(actor || reference) loss; loads a reference model.")
    kl_loss_coef: float = Field(0.0, ge=0.0, description="Weight of the KL loss.")
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field("low_var_kl", description="KL estimator.")
    use_rollout_logprobs: bool = Field(
        False, description="Old-policy log-probs = the engine's rollout_log_probs: the trainer skips its own "
                           "log-prob forward (the reference forward still runs when needed).")
    seed: int = Field(1234, description="Trainer seed (torch RNG of every rank).")


class CheckpointConfig(_Section):
    """Saving and resuming."""

    save: str | None = Field(None, description="Directory for iter_XXXXXXX checkpoints.")
    save_interval: int | None = Field(None, ge=1, description="Save after every K rollouts (and the last one).")
    load: str | None = Field(None, description="Resume from the latest checkpoint in this directory.")
    ci_save_model_hash: bool = Field(False, description="Write per-layer SHA-256 hashes next to every checkpoint.")
    ci_check_model_hash: bool = Field(
        False, description="After --load, check the loaded weights against the checkpoint's per-layer hashes.")


class DebugConfig(_Section):
    """Cutting the loop: rollout-only / train-only, record and replay (slime/miles flag names)."""

    debug_rollout_only: bool = Field(False, description="Generate and save rollouts only; no trainer is created.")
    debug_train_only: bool = Field(False, description="Train from recorded rollouts only; no engine is created.")
    save_debug_rollout_data: str | None = Field(
        None, description="Also write every rollout to TPL.format(rollout_id=...) (.parquet or slime .pt).")
    load_debug_rollout_data: str | None = Field(
        None, description="Train from recordings at TPL (.parquet or .pt); implies --debug-train-only.")
    load_debug_rollout_data_subsample: float | None = Field(
        None, gt=0.0, le=1.0, description="Keep this fraction of each loaded rollout (head + tail rule).")
    trust_pickle: bool = Field(False, description="Allow .pt recordings that need arbitrary unpickling.")
    dump_details: str | None = Field(
        None, description="Write rollout_data/{id} and train_data/{id}_{rank} under this directory.")
    save_debug_train_data: str | None = Field(
        None, description="Write each rank's training batch to TPL.format(rollout_id=..., rank=...).")
    ci_inject_rollout_data_path: str | None = Field(
        None, description="From the start id on, train on these recordings and compare fresh generations to them.")
    ci_inject_rollout_data_start_rollout_id: int = Field(0, ge=0, description="First rollout id injected.")
    ci_inject_rollout_data_min_match_ratio: float = Field(
        0.9, ge=0.0, le=1.0, description="Mean response-token match ratio that fresh generations must exceed.")
    debug_skip_weight_update: bool = Field(
        False, description="Keep the release/resume schedule of the sync but skip the weight transfer itself.")
    debug_disable_optimizer: bool = Field(
        False, description="Build no optimizer or LR scheduler; forward/backward still run, weights never change.")
    debug_exit_after_rollout: int | None = Field(
        None, ge=1, description="End cleanly after this many rollouts of this run (for resume tests).")
    debug_deterministic_collective: bool = Field(
        False, description="Sum reductions by all-gather + fixed-order fold: bitwise across DP topologies (slow).")
    load_forge_rollout_data: str | None = Field(
        None, description="Replay recordings while engines stay alive and weights keep syncing.")


class CIConfig(_Section):
    """The --ci-test assertion harness (miles' checkers), each with its escape hatch."""

    ci_test: bool = Field(False, description="Turn on the in-process checkers below.")
    ci_disable_kl_checker: bool = Field(False, description="Skip the step-0 KL / clipfrac / kl_loss checks.")
    ci_disable_logprobs_checker: bool = Field(False, description="Skip the log-prob / entropy checks.")
    ci_disable_weight_update_checker: bool = Field(False, description="Skip the first-sync weight check.")
    check_weight_update_equal: bool = Field(
        False, description="Scramble engine weights, sync once, require every tensor bitwise equal (also without --ci-test).")
    check_weight_update_skip_list: str | None = Field(
        None, description="Comma-separated weight names the weight-update check ignores.")
    ci_logprobs_checker_abs_tol: float = Field(0.03, gt=0.0, description="Trainer vs engine log-prob tolerance.")
    ci_entropy_max: float = Field(0.7, gt=0.0, description="Upper bound of rollout/entropy (miles: 0.7).")
    ci_metric_checker_key: str | None = Field(None, description="Eval metric the accuracy gate reads.")
    ci_metric_checker_threshold: float | None = Field(None, description="The gate passes when key >= threshold.")
    ci_metric_checker_expect_num: int | None = Field(
        None, ge=1, description="Require exactly N evals, all passing (default: at least one passing).")
    ci_save_grad_norm: str | None = Field(None, description="Write grad norms to TPL ({role}, {rollout_id}, {step_id}).")
    ci_load_grad_norm: str | None = Field(None, description="Compare grad norms with TPL (rel = abs = 0.03).")
    ci_fault_drop_weight: str | None = Field(
        None, description="Fault injection: engines silently skip these tensors on every weight update: "
                          "comma-separated names or globs (model.layers.*.mlp.up_proj.weight).")

    @property
    def weight_check(self) -> bool:
        return self.check_weight_update_equal or (self.ci_test and not self.ci_disable_weight_update_checker)


class FaultConfig(_Section):
    """Fault hooks (miles' request model) and what the run does to survive faults."""

    ci_fault_hooks: str | None = Field(
        None, description="JSON list of fault hook requests (request_id, hook_name, action {kind, ...}, target, "
                          "rollout_id, attempt, weight_version, delay_ms, lifetime_seconds).")
    ci_fault_hooks_path: str | None = Field(None, description="A file holding the same JSON as --ci-fault-hooks.")
    task_retries: int = Field(2, ge=0, le=20, description="Prefect retries of a failed stage (not of a checker "
                                                           "failure, which is deterministic).")
    task_retry_delay: float = Field(1.0, ge=0, le=600, description="Seconds between a stage's attempts.")
    rollout_timeout: float | None = Field(
        600.0, gt=0, le=86_400, description="Seconds an engine may take for one generate/eval call before it is "
                                            "killed, restarted and the stage retried; None = no limit.")
    train_timeout: float | None = Field(
        1800.0, gt=0, le=86_400, description="Seconds the trainers may take for one stage (log-prob, train-step, "
                                             "save) before they are restarted from their snapshot; None = no limit.")
    update_weights_timeout: float | None = Field(
        600.0, gt=0, le=86_400, description="Seconds a weight sync may take before its actors are restarted; "
                                            "None = no limit.")
    prefect_timeout: float = Field(60.0, gt=0, le=3600, description="Fail the run, with a message, when the Prefect "
                                                                    "API has not answered for this many seconds.")

    @model_validator(mode="after")
    def _hooks_parse(self) -> FaultConfig:
        from faults.models import parse_requests

        parse_requests(self.ci_fault_hooks, self.ci_fault_hooks_path)
        return self

    def requests(self) -> list:
        """The parsed fault hook requests."""
        from faults.models import parse_requests

        return parse_requests(self.ci_fault_hooks, self.ci_fault_hooks_path)


WandbMode = Literal["online", "offline", "disabled"]


class LoggingConfig(_Section):
    """Experiment trackers (slime's flags and step keys): W&B and TensorBoard, each an optional extra.

    Every record of metrics.jsonl except `check` records also goes to each tracker turned on, with
    slime's step keys: rollout and perf records at `rollout/step` = rollout id, train steps at
    `train/step`, evals at `eval/step`."""

    use_wandb: bool = Field(False, description="Log metrics to Weights & Biases (needs the wandb extra).")
    wandb_project: str | None = Field(None, description="W&B project; None = W&B's default.")
    wandb_team: str | None = Field(None, description="W&B entity (team or user); None = your default entity.")
    wandb_group: str | None = Field(
        None, description="W&B group that gathers related runs; the W&B run itself is named --name.")
    wandb_mode: WandbMode | None = Field(
        None, description="online, offline (written locally, `wandb sync` uploads it later) or disabled; "
                          "None = the WANDB_MODE environment variable, else online.")
    wandb_dir: str | None = Field(None, description="Directory W&B writes its files under (DIR/wandb/...); "
                                                    "None = the working directory.")
    use_tensorboard: bool = Field(False, description="Write TensorBoard event files (needs the tensorboard extra).")
    tb_project_name: str | None = Field(
        None, description="TensorBoard logs go to tensorboard_log/<project>/<experiment> (or $TENSORBOARD_DIR); "
                          "--use-tensorboard needs this or TENSORBOARD_DIR, as in slime.")
    tb_experiment_name: str | None = Field(
        None, description="TensorBoard experiment; None = the start time (YYYYmmdd_HHMMSS), as in slime.")


class RunConfig(_Section):
    """One RL run: every concern plus where it lives."""

    name: str = Field("tiny-arith", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name (Prefect flow run name).")
    run_dir: str | None = Field(None, description="Run directory; None = runs/<name>.")
    recipe: Literal["tiny-arith"] = Field(
        "tiny-arith", description="Preset that fills in what the flags leave unset: base model (--hf-checkpoint), "
                                  "prompt data and keys, eval data, reward.")
    hf_checkpoint: str | None = Field(None, description="HF model dir (model + tokenizer); None = the recipe's.")
    num_threads: int = Field(
        1, ge=1, description="torch threads in every actor (bitwise replay needs the same count everywhere)."
    )
    ray_address: str | None = Field(None, description="Join this Ray cluster instead of starting a local one.")
    rollout: RolloutConfig = RolloutConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    debug: DebugConfig = DebugConfig()
    ci: CIConfig = CIConfig()
    faults: FaultConfig = FaultConfig()
    logging: LoggingConfig = LoggingConfig()
    ref_load: str | None = Field(
        None, description="Reference model (an HF dir or a --save dir); also the starting weights when --load holds "
                          "no checkpoint (slime's meaning); None = --hf-checkpoint.")

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        _check_debug(self.debug)
        r, t, c = self.rollout, self.train, self.checkpoint
        total = r.rollout_batch_size * r.n_samples_per_prompt
        gbs = t.global_batch_size or total
        if total % gbs:
            raise ValueError(
                f"--global-batch-size {gbs} must divide --rollout-batch-size x --n-samples-per-prompt = {total}"
            )
        if gbs % t.data_parallel_size:
            raise ValueError(f"--global-batch-size {gbs} must be divisible by --data-parallel-size {t.data_parallel_size}")
        per_rank = gbs // t.data_parallel_size
        if t.micro_batch_size is not None and per_rank % t.micro_batch_size:
            raise ValueError(
                f"--micro-batch-size {t.micro_batch_size} must divide the per-rank batch {per_rank} "
                f"(--global-batch-size / --data-parallel-size)"
            )
        _check_parallelism(t)
        if t.kl_loss_coef and not t.use_kl_loss:
            raise ValueError("--kl-loss-coef is set but --use-kl-loss is not")
        if c.save_interval is not None and c.save is None:
            raise ValueError("--save-interval needs --save DIR")
        if c.ci_save_model_hash and c.save is None:
            raise ValueError("--ci-save-model-hash needs --save DIR")
        if c.ci_check_model_hash and c.load is None:
            raise ValueError("--ci-check-model-hash needs --load DIR")
        ci = self.ci
        if (ci.ci_metric_checker_key is None) != (ci.ci_metric_checker_threshold is None):
            raise ValueError("--ci-metric-checker-key and --ci-metric-checker-threshold go together")
        if ci.ci_metric_checker_expect_num is not None and ci.ci_metric_checker_key is None:
            raise ValueError("--ci-metric-checker-expect-num needs --ci-metric-checker-key")
        for flag, tpl in (("--ci-save-grad-norm", ci.ci_save_grad_norm), ("--ci-load-grad-norm", ci.ci_load_grad_norm)):
            if tpl is not None:
                try:
                    tpl.format(role="actor", rollout_id=0, step_id=0)
                except (KeyError, IndexError, ValueError) as e:
                    raise ValueError(f"{flag} {tpl!r}: bad template ({e}); fields: role, rollout_id, step_id") from None
        return self

    # -- derived values (one place) ---------------------------------------------------------------
    @property
    def train_only(self) -> bool:
        """No engines: --debug-train-only, or implied by --load-debug-rollout-data."""
        return self.debug.debug_train_only or self.debug.load_debug_rollout_data is not None

    @property
    def rollout_only(self) -> bool:
        """No trainer: --debug-rollout-only."""
        return self.debug.debug_rollout_only

    @property
    def rollout_template(self) -> str | None:
        """Where every rollout is also recorded (--dump-details wins over --save-debug-rollout-data)."""
        if self.debug.dump_details:
            return str(Path(self.debug.dump_details) / "rollout_data" / "{rollout_id}.parquet")
        return self.debug.save_debug_rollout_data

    @property
    def train_data_template(self) -> str | None:
        """Where each rank's training batch is recorded."""
        if self.debug.dump_details:
            return str(Path(self.debug.dump_details) / "train_data" / "{rollout_id}_{rank}.parquet")
        return self.debug.save_debug_train_data

    @property
    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}").resolve()

    @property
    def trainer_world_size(self) -> int:
        """Trainer ranks (one actor each): tensor-parallel x data-parallel."""
        return self.train.tensor_model_parallel_size * self.train.data_parallel_size

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.train.global_batch_size or self.samples_per_rollout

    @property
    def micro_batch_size(self) -> int:
        return self.train.micro_batch_size or self.global_batch_size // self.train.data_parallel_size

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.global_batch_size

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the whole config."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def section_hash(self, *names: str) -> str:
        """sha256 of some sections only (the config slice a task's cache key depends on)."""
        data = {n: getattr(self, n).model_dump() if isinstance(getattr(self, n), BaseModel) else getattr(self, n)
                for n in names}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


RECORDING_FORMATS = (".parquet", ".pt")


def _check_template(flag: str, template: str | None, *, need_id: bool, extra: tuple[str, ...] = ()) -> None:
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
        raise ValueError(f"{flag} {template!r} has no {{rollout_id}}: a literal path would be overwritten "
                         f"by every rollout; use e.g. /tmp/rollout_{{rollout_id}}.parquet")
    if not template.endswith(RECORDING_FORMATS):
        raise ValueError(f"{flag} {template!r}: the extension picks the format; use one of {RECORDING_FORMATS}")


def _check_parallelism(t: TrainConfig) -> None:
    """Parallelism the chosen backend cannot do is refused here, not silently ignored."""
    can = "tensor and data parallel" if t.train_backend == "megatron" else "data parallel"
    for flag, value in (("--pipeline-model-parallel-size", t.pipeline_model_parallel_size),
                        ("--context-parallel-size", t.context_parallel_size)):
        if value > 1:
            raise ValueError(f"{flag} {value}: not supported yet (the {t.train_backend} backend runs {can} only); "
                             "leave it at 1")
    if t.sequence_parallel:
        raise ValueError(f"--sequence-parallel: not supported yet (the {t.train_backend} backend runs {can} only)")
    if t.train_backend != "megatron" and t.tensor_model_parallel_size > 1:
        raise ValueError(f"--tensor-model-parallel-size {t.tensor_model_parallel_size} needs --train-backend "
                         f"megatron (the {t.train_backend} backend is data parallel only)")
    if t.train_backend == "megatron":
        from importlib import metadata

        try:  # the installed distribution, not an import: megatron is only ever imported by its backend
            metadata.version("megatron-core")
        except metadata.PackageNotFoundError:
            raise ValueError("--train-backend megatron needs megatron-core: install the extra, "
                             "pip install 'rollflow[megatron]'") from None


def _check_debug(d: DebugConfig) -> None:
    """The anchors' validation order: load implies train-only, then the mutual exclusions."""
    train_only = d.debug_train_only or d.load_debug_rollout_data is not None
    if train_only and d.debug_rollout_only:
        why = "--load-debug-rollout-data (implies --debug-train-only)" if d.load_debug_rollout_data else "--debug-train-only"
        raise ValueError(f"--debug-rollout-only and {why} are mutually exclusive")
    if d.load_debug_rollout_data_subsample is not None and d.load_debug_rollout_data is None:
        raise ValueError("--load-debug-rollout-data-subsample needs --load-debug-rollout-data")
    if d.ci_inject_rollout_data_path and train_only:
        raise ValueError("--ci-inject-rollout-data-path compares fresh generations, so it needs engines: "
                         "drop --debug-train-only / --load-debug-rollout-data")
    if d.ci_inject_rollout_data_path and d.debug_rollout_only:
        raise ValueError("--ci-inject-rollout-data-path feeds training, so it cannot run with --debug-rollout-only")
    if d.load_forge_rollout_data and (train_only or d.debug_rollout_only):
        raise ValueError("--load-forge-rollout-data keeps engines and trainer running: it cannot be combined "
                         "with --debug-train-only, --debug-rollout-only or --load-debug-rollout-data")
    if d.load_forge_rollout_data and d.ci_inject_rollout_data_path:
        raise ValueError("--load-forge-rollout-data and --ci-inject-rollout-data-path are mutually exclusive")
    _check_template("--save-debug-rollout-data", d.save_debug_rollout_data, need_id=True)
    _check_template("--save-debug-train-data", d.save_debug_train_data, need_id=True, extra=("rank",))
    _check_template("--ci-inject-rollout-data-path", d.ci_inject_rollout_data_path, need_id=True)
    _check_template("--load-debug-rollout-data", d.load_debug_rollout_data, need_id=False)
    _check_template("--load-forge-rollout-data", d.load_forge_rollout_data, need_id=False)
    if d.save_debug_rollout_data and d.save_debug_rollout_data == d.save_debug_train_data:
        raise ValueError("--save-debug-rollout-data and --save-debug-train-data must differ")


SECTIONS: dict[str, type[_Section]] = {
    "rollout": RolloutConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "eval": EvalConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "debug": DebugConfig,
    "ci": CIConfig,
    "faults": FaultConfig,
    "logging": LoggingConfig,
}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (nested by section, the format `config.yaml` in a run dir is written in)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(p.read_bytes().decode("utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ValueError(f"--config {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"--config {path}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping at the top level, got {type(data).__name__}")
    for section, value in data.items():
        if section in SECTIONS and not isinstance(value, dict):
            raise ValueError(f"--config {path}: section {section!r} must be a mapping of its fields, got "
                             f"{type(value).__name__} {value!r}")
    return data


def dump_yaml(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False)
