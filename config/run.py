"""One RL run: every section, where the run lives, the combinations that are refused, and the YAML format."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ModelWrapValidatorHandler, field_validator, model_validator

from config.arch import ArchConfig
from config.base import Section
from config.debug import CIConfig, DebugConfig, check_debug
from config.ops import FaultConfig, LoggingConfig
from config.placement import PlacementConfig, check_placement, derive_slots
from config.plugins import LossConfig, SamplingConfig
from config.presets import RECIPE_PRESETS, apply_preset
from config.rollout import DataConfig, EvalConfig, RewardConfig, RolloutConfig
from config.sglang import SGLangConfig
from config.train import (
    CheckpointConfig,
    TrainConfig,
    check_parallelism,
    check_steps_per_rollout,
)

NAME_MAX = 100  # characters of a run name
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}")


class RunConfig(Section):
    """One RL run: every concern plus where it lives."""

    name: str = Field(
        "tiny-arith",
        description=f"Run name (Prefect flow run name; the run dir runs/<name> by default): up to {NAME_MAX} "
        "letters, digits, '_', '-' and '.', starting with a letter or digit. Unset on --prompt-data: "
        "--wandb-group, else the data file's name (with its dir's for train/test/data...).",
    )
    run_dir: str | None = Field(None, description="Run directory; None = runs/<name>.")
    recipe: Literal["tiny-arith", "long-arith", "long-arith-50m", "long-arith-0.5b"] = Field(
        "tiny-arith",
        description="Preset that fills in what the flags leave unset: base model (--hf-checkpoint), "
        "prompt data and keys, eval data, reward. long-arith: step-by-step "
        "additions answered in 64-256 tokens by a 3.2M-parameter model (the perf workload). long-arith-50m, "
        "long-arith-0.5b: its prompts and reward with untrained Qwen2 models of 50.7M parameters and of "
        "Qwen2.5-0.5B's shape (494M), vocabulary 151,936 (the scaling workload: cost, not learning).",
    )
    hf_checkpoint: str | None = Field(
        None, description="HF model dir (model + tokenizer); None = the recipe's."
    )
    num_threads: int = Field(
        1, ge=1, description="torch threads in every actor (bitwise replay needs the same count everywhere)."
    )
    ray_address: str | None = Field(
        None, description="Join this Ray cluster instead of starting a local one."
    )
    rollout: RolloutConfig = RolloutConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    train: TrainConfig = TrainConfig()
    loss: LossConfig = LossConfig()
    sampling: SamplingConfig = SamplingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    debug: DebugConfig = DebugConfig()
    ci: CIConfig = CIConfig()
    faults: FaultConfig = FaultConfig()
    logging: LoggingConfig = LoggingConfig()
    placement: PlacementConfig = PlacementConfig()
    arch: ArchConfig = ArchConfig()
    sglang: SGLangConfig = SGLangConfig()
    ref_load: str | None = Field(
        None,
        description="Reference model (an HF dir or a --save dir); also the starting weights when --load holds "
        "no checkpoint (slime's meaning); None = --hf-checkpoint.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _slime_derivations(cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig]) -> RunConfig:
        """What a launch line leaves unset: the trainer and engine counts from slime's GPU-count flags, the name of a
        run on user data, and the recipe's preset (config/presets.py), which does not count as given (a
        deployment's served defaults still apply over it)."""
        if not isinstance(data, dict):
            return handler(data)
        derived = _name_from_data(derive_slots(data))
        full = apply_preset(derived)
        cfg = handler(full)
        if full is not derived:
            _forget_preset(cfg, derived)
        return cfg

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # the name is a path component of the default run dir: `..` or `.` would make it the parent or the
        # working directory
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"a run name is 1-{NAME_MAX} letters, digits, '_', '-' or '.', starting with a letter or digit "
                "(it names the run dir runs/<name>)"
            )
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        check_debug(self.debug)
        r, t, c = self.rollout, self.train, self.checkpoint
        total = r.rollout_batch_size * r.n_samples_per_prompt
        check_steps_per_rollout(t, total)
        gbs = self.global_batch_size
        if total % gbs:
            raise ValueError(
                f"--global-batch-size {gbs} must divide --rollout-batch-size x --n-samples-per-prompt = {total}"
            )
        if gbs % t.data_parallel_size:
            raise ValueError(
                f"--global-batch-size {gbs} must be divisible by --data-parallel-size {t.data_parallel_size}"
            )
        per_rank = gbs // t.data_parallel_size
        if t.micro_batch_size is not None and per_rank % t.micro_batch_size:
            raise ValueError(
                f"--micro-batch-size {t.micro_batch_size} must divide the per-rank batch {per_rank} "
                f"(--global-batch-size / --data-parallel-size)"
            )
        check_parallelism(t)
        check_placement(
            self.placement,
            world_size=self.trainer_world_size,
            tp=t.tensor_model_parallel_size,
            dp=t.data_parallel_size,
            rollout_num_engines=r.rollout_num_engines,
            rollout_num_gpus=r.rollout_num_gpus,
            rollout_num_gpus_per_engine=r.rollout_num_gpus_per_engine,
        )
        if self.placement.offloads_rollout and self.debug.debug_skip_weight_update:
            raise ValueError(
                "--offload-rollout releases the engines' weights until the weight sync loads them back, and "
                "--debug-skip-weight-update skips that load: leave one of them out"
            )
        self.faults.check_targets(
            engines=0 if self.train_only else r.rollout_num_engines,
            trainer_ranks=0 if self.rollout_only else self.trainer_world_size,
        )
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
        for flag, tpl in (
            ("--ci-save-grad-norm", ci.ci_save_grad_norm),
            ("--ci-load-grad-norm", ci.ci_load_grad_norm),
        ):
            if tpl is not None:
                try:
                    tpl.format(role="actor", rollout_id=0, step_id=0)
                except (KeyError, IndexError, ValueError) as e:
                    raise ValueError(
                        f"{flag} {tpl!r}: bad template ({e}); fields: role, rollout_id, step_id"
                    ) from None
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
        """The run dir as an absolute path, symlinks resolved (against the current directory)."""
        return _resolved(os.getcwd(), self.run_dir or f"runs/{self.name}")

    @property
    def trainer_world_size(self) -> int:
        """Trainer ranks (one actor each): tensor-parallel x data-parallel."""
        return self.train.tensor_model_parallel_size * self.train.data_parallel_size

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        if self.train.num_steps_per_rollout is not None:  # slime: it sets the global batch
            return self.samples_per_rollout // self.train.num_steps_per_rollout
        if self.train.global_batch_size is not None:
            return self.train.global_batch_size
        if self.train.micro_batch_size is not None:  # Megatron's default: one micro-batch per DP rank
            return self.train.micro_batch_size * self.train.data_parallel_size
        return self.samples_per_rollout

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
        data = {
            n: getattr(self, n).model_dump() if isinstance(getattr(self, n), BaseModel) else getattr(self, n)
            for n in names
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


@functools.lru_cache(maxsize=64)
def _resolved(cwd: str, path: str) -> Path:
    # asked for dozens of times per rollout (every path of the run dir hangs off it); resolving stats every
    # component of the path each time
    return (Path(cwd) / path).resolve()


SECTIONS: dict[str, type[Section]] = {
    "rollout": RolloutConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "eval": EvalConfig,
    "train": TrainConfig,
    "loss": LossConfig,
    "sampling": SamplingConfig,
    "checkpoint": CheckpointConfig,
    "debug": DebugConfig,
    "ci": CIConfig,
    "faults": FaultConfig,
    "logging": LoggingConfig,
    "placement": PlacementConfig,
    "arch": ArchConfig,
    "sglang": SGLangConfig,
}


def _forget_preset(cfg: RunConfig, given: dict[str, Any]) -> None:
    """Mark the fields the recipe preset filled in as not given (model_fields_set), as their defaults would be."""
    sections = set()
    for section, values in RECIPE_PRESETS[cfg.recipe].items():
        held = given.get(section)
        if held is None:
            sections.add(section)
            keys: set[str] = set()
        elif isinstance(held, dict):
            keys = set(held)
        else:
            keys = set(held.model_fields_set)
        model = getattr(cfg, section)
        object.__setattr__(model, "__pydantic_fields_set__", model.model_fields_set - (set(values) - keys))
    object.__setattr__(cfg, "__pydantic_fields_set__", cfg.model_fields_set - sections)


# data file names that say nothing of the data: their dir's name goes first
_GENERIC_STEMS = frozenset(
    {"train", "test", "dev", "val", "valid", "validation", "eval", "data", "prompts", "input"}
)


def _name_from_data(data: dict[str, Any]) -> dict[str, Any]:
    """A run with no --name is named after --wandb-group, else its data file (runs/<name> would otherwise be the
    same dir for every data set); on a recipe's own data, after the recipe."""
    prompts = data.get("data")
    path = prompts.get("prompt_data") if isinstance(prompts, dict) else getattr(prompts, "prompt_data", None)
    if "name" in data:
        return data
    if not isinstance(path, str) or not path:  # the recipe's own data: the recipe names the run
        recipe = data.get("recipe")
        known = typing.get_args(RunConfig.model_fields["recipe"].annotation)
        return {**data, "name": recipe} if recipe in known else data  # an unknown one is refused by its field
    logging = data.get("logging")
    group = logging.get("wandb_group") if isinstance(logging, dict) else getattr(logging, "wandb_group", None)
    return {**data, "name": plain_name(group if isinstance(group, str) and group else _data_name(path))}


def _data_name(path: str) -> str:
    p = Path(path)
    stem = p.name.split(".")[0] or p.name
    if stem.lower() in _GENERIC_STEMS and p.parent.name:
        return f"{p.parent.name}-{stem}"
    return stem


def plain_name(text: str) -> str:
    """`text` made a run name: characters outside letters, digits, '_', '-', '.' become '-', leading ones that
    cannot start a name are dropped, at most NAME_MAX characters; "run" when nothing is left."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", text).lstrip("_.-")[:NAME_MAX]
    return name or "run"


def load_yaml(path: str | Path, what: str | None = None) -> dict[str, Any]:
    """Read a YAML config file (nested by section, the format `config.yaml` in a run dir is written in) with
    `config.yaml_file.BoundedLoader` (no duplicate keys, bounded aliases and size); raises ValueError with one
    line that starts with `what` (default "--config PATH") and names the line."""
    from config.yaml_file import quote, read

    what = what or f"--config {path}"
    data = read(Path(path), what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a mapping at the top level, got {type(data).__name__}")
    for section, value in data.items():
        if section in SECTIONS and not isinstance(value, dict):
            raise ValueError(
                f"{what}: section {section!r} must be a mapping of its fields, got "
                f"{type(value).__name__} {quote(value)}"
            )
    return data


def dump_yaml(cfg: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False)
