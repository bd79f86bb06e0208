"""Typed run configuration: one frozen pydantic model per concern.

The same models are the flow's parameters (Prefect renders them as forms), the YAML file
format (`--config FILE.yaml`, nested by concern) and the CLI flags (`flows/cli.py` derives one
flag per field: `rollout_batch_size` -> `--rollout-batch-size`, slime's names where one exists).
Defaults live here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RolloutConfig(_Section):
    """What to generate each rollout and how to sample it."""

    num_rollout: int = Field(30, ge=1, description="Number of rollouts (RL iterations) in the run.")
    rollout_batch_size: int = Field(32, ge=1, description="Prompts per rollout.")
    n_samples_per_prompt: int = Field(8, ge=1, description="Responses sampled per prompt (the GRPO group size).")
    rollout_max_response_len: int = Field(6, ge=1, description="Max new tokens per response.")
    rollout_temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    rollout_top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    rollout_top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 disables it.")
    rollout_seed: int = Field(42, description="Seed of the prompt order and of every per-sample sampling seed.")
    rollout_backend: Literal["torch", "sglang"] = Field("torch", description="Inference engine backend.")
    rollout_num_engines: int = Field(1, ge=1, description="Engine actors; prompt groups are spread over them.")


class EvalConfig(_Section):
    """Held-out evaluation."""

    eval_interval: int | None = Field(
        5, ge=1, description="Evaluate every N rollouts (and at rollout 0 and after the last); None disables eval."
    )
    n_samples_per_eval_prompt: int = Field(4, ge=1, description="Samples per eval prompt.")
    eval_temperature: float | None = Field(None, gt=0.0, description="Eval sampling temperature; None = rollout's.")


class TrainConfig(_Section):
    """The trainer: batch schedule, optimiser and the RL loss."""

    train_backend: Literal["torch", "megatron"] = Field("torch", description="Trainer backend.")
    data_parallel_size: int = Field(1, ge=1, description="Trainer ranks (one Ray actor each, gloo on CPU).")
    global_batch_size: int | None = Field(
        128, ge=1, description="Samples per optimizer step; None = the whole rollout (one step per rollout)."
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Samples per forward/backward on one rank; None = the rank's share of the step."
    )
    lr: float = Field(1e-4, gt=0.0, description="Peak learning rate (AdamW).")
    lr_decay_style: Literal["constant", "linear", "cosine"] = Field("constant", description="LR schedule.")
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
    seed: int = Field(1234, description="Trainer seed (torch RNG of every rank).")


class CheckpointConfig(_Section):
    """Saving and resuming."""

    save: str | None = Field(None, description="Directory for iter_XXXXXXX checkpoints.")
    save_interval: int | None = Field(None, ge=1, description="Save after every K rollouts (and the last one).")
    load: str | None = Field(None, description="Resume from the latest checkpoint in this directory.")


class RunConfig(_Section):
    """One RL run: every concern plus where it lives."""

    name: str = Field("tiny-arith", pattern=r"^[A-Za-z0-9_.-]+$", description="Run name (Prefect flow run name).")
    run_dir: str | None = Field(None, description="Run directory; None = runs/<name>.")
    recipe: Literal["tiny-arith"] = Field("tiny-arith", description="Data, reward and base model recipe.")
    hf_checkpoint: str | None = Field(None, description="HF model dir; None = the recipe's bootstrapped model.")
    num_threads: int = Field(
        1, ge=1, description="torch threads in every actor (bitwise replay needs the same count everywhere)."
    )
    ray_address: str | None = Field(None, description="Join this Ray cluster instead of starting a local one.")
    rollout: RolloutConfig = RolloutConfig()
    eval: EvalConfig = EvalConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
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
        if t.kl_loss_coef and not t.use_kl_loss:
            raise ValueError("--kl-loss-coef is set but --use-kl-loss is not")
        if c.save_interval is not None and c.save is None:
            raise ValueError("--save-interval needs --save DIR")
        return self

    # -- derived values (one place) ---------------------------------------------------------------
    @property
    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir or f"runs/{self.name}").resolve()

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


SECTIONS: dict[str, type[_Section]] = {
    "rollout": RolloutConfig,
    "eval": EvalConfig,
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
}


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (nested by section, the format `config.yaml` in a run dir is written in)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {path}: no such file")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a mapping at the top level")
    return data


def dump_yaml(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False)
