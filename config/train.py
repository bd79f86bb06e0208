"""The trainer (batch schedule, optimiser, RL loss, parallelism) and checkpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from config.backends import TRAINERS
from config.base import SEED_MAX, Section
from config.precision import Precision

# the trainer choices are the registry's keys (an unregistered backend is refused at parse time)
TrainBackend = Literal[tuple(TRAINERS)]  # type: ignore[valid-type]


class TrainConfig(Section):
    """The trainer: batch schedule, optimiser and the RL loss."""

    train_backend: TrainBackend = Field("torch", description="Trainer backend.")  # type: ignore[valid-type]
    data_parallel_size: int = Field(
        1,
        ge=1,
        le=65_536,
        description="Data-parallel trainer ranks (gloo on CPU); the trainer "
        "actors are tensor x data parallel, one rank each.",
    )
    tensor_model_parallel_size: int = Field(
        1, ge=1, description="Tensor-parallel ranks per model replica (megatron backend only)."
    )
    pipeline_model_parallel_size: int = Field(
        1, ge=1, description="Pipeline-parallel stages; only 1 is supported so far (refused otherwise)."
    )
    context_parallel_size: int = Field(
        1, ge=1, description="Context-parallel ranks; only 1 is supported so far (refused otherwise)."
    )
    sequence_parallel: bool = Field(
        False,
        description="Megatron sequence parallelism: splits activations along the sequence over the TP ranks. "
        "At --tensor-model-parallel-size 1 it is a no-op in Megatron and accepted; above 1 it is refused "
        "(the megatron trainer keeps whole sequences on every TP rank: same results without it).",
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="Samples per optimizer step; None = Megatron's (and so slime's) default, --micro-batch-size x "
        "--data-parallel-size, or the whole rollout (one step per rollout) with --micro-batch-size none.",
    )
    micro_batch_size: int | None = Field(
        1,
        ge=1,
        description="Samples per forward/backward on one rank (slime's default 1); None = the rank's share of "
        "the step.",
    )
    lr: float = Field(1e-6, gt=0.0, description="Peak learning rate (slime's default 1e-6).")
    lr_decay_style: Literal["constant", "linear", "cosine"] = Field(
        "linear",
        description="LR schedule (decays to --min-lr over the run's optimizer steps; Megatron's default linear).",
    )
    lr_warmup_iters: int = Field(0, ge=0, description="Optimizer steps of linear warm-up.")
    min_lr: float = Field(0.0, ge=0.0, description="Floor of the decayed LR.")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW weight decay (Megatron's default 0.01).")
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
    use_kl_loss: bool = Field(
        False, description="Add a KL(actor || reference) loss; loads a reference model."
    )
    kl_loss_coef: float = Field(0.0, ge=0.0, description="Weight of the KL loss.")
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = Field(
        "k1", description="KL estimator (slime's default k1)."
    )
    use_rollout_logprobs: bool = Field(
        False,
        description="Old-policy log-probs = the engine's rollout_log_probs: the trainer skips its own "
        "log-prob forward (the reference forward still runs when needed).",
    )
    seed: int = Field(1234, ge=0, le=SEED_MAX, description="Trainer seed (torch RNG of every rank).")
    use_dynamic_batch_size: bool = Field(
        False,
        description="Micro-batches by a token budget instead of --micro-batch-size: each step's samples are "
        "packed first-fit, in order, into micro-batches of at most --max-tokens-per-gpu prompt+response tokens "
        "(a longer sample alone), split further until every DP rank gets the same number (slime's packing).",
    )
    max_tokens_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Token budget of one micro-batch on one rank (--use-dynamic-batch-size). It bounds a "
        "micro-batch's activations; with --recompute-granularity they are small, and every micro-batch after "
        "a step's first holds a second [vocab, hidden] float32 gradient of the output layer through its backward "
        "(the torch trainer), so a larger budget can lower the peak.",
    )
    recompute_granularity: Literal["full", "selective"] | None = Field(
        None,
        description="Activation checkpointing: full = recompute whole decoder layers in the backward; "
        "selective = recompute the core attention only (Megatron). Either way the torch trainer's output layer "
        "recomputes its [tokens, vocab] log-softmax too. Gradients are unchanged.",
    )
    recompute_method: Literal["uniform", "block"] | None = Field(
        None,
        description="Which layers --recompute-granularity full recomputes: uniform = every layer, in chunks "
        "of --recompute-num-layers; block = the first --recompute-num-layers layers only.",
    )
    recompute_num_layers: int | None = Field(
        None, ge=1, description="Layers per recompute chunk (uniform) or recomputed layers (block)."
    )
    calculate_per_token_loss: bool = Field(
        False,
        description="Average the loss over the tokens of the whole optimizer step instead of per sample "
        "first (slime's default is the per-sample mean).",
    )
    num_steps_per_rollout: int | None = Field(
        None,
        ge=1,
        description="Optimizer steps per rollout: sets --global-batch-size to --rollout-batch-size x "
        "--n-samples-per-prompt / N (an explicit --global-batch-size must agree).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="KL reward shaping (slime's meaning): reinforce_plus_plus_baseline advantages become "
        "A - kl_coef * KL(old || reference) per token (--kl-loss-type estimator); grpo and rloo ignore it, "
        "as slime's grpo returns do. Loads the reference model.",
    )
    balance_data: bool = Field(
        False,
        description="Hand each step's micro-batches to the DP ranks by Karmarkar-Karp on their estimated "
        "forward FLOPs (equal micro-batch count per rank) instead of in turn; no change on one DP rank.",
    )
    normalize_advantages: bool = Field(
        False,
        description="Whiten the advantages over the rollout's loss tokens (mean 0, unbiased std 1), as "
        "slime does over all DP ranks.",
    )
    optimizer: Literal["adam", "sgd"] = Field(
        "adam",
        description="adam = AdamW (decoupled --weight-decay); sgd = SGD with --sgd-momentum (Megatron's).",
    )
    sgd_momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum (--optimizer sgd).")
    optimizer_offload_dir: str | None = Field(
        None,
        description="Keep AdamW's two moments in a file under this directory (on a disk, not tmpfs) instead of "
        "in memory, as DeepSpeed's optimizer offload to NVMe does: each step reads and writes them a chunk at a "
        "time, and they leave memory after every use. Lowers the trainer's peak by 8 bytes a parameter (0.5B: "
        "3.7 GiB) for a read and a write of them per optimizer step. CPU trainers, --optimizer adam only.",
    )
    deterministic_mode: bool = Field(
        False,
        description="torch.use_deterministic_algorithms(True) on every trainer rank and Megatron's "
        "deterministic_mode; errors out on an op with no deterministic kernel. On the CPU our kernels are "
        "already run-to-run deterministic, so this is a check, not a change of results.",
    )

    precision: Precision = Field(
        "fp32",
        description="Numeric precision of the engines and the trainer: bf16 = bfloat16 engine weights and KV "
        "cache, the trainer's forward under CPU autocast to bfloat16 with float32 master weights, optimizer "
        "state, log-probs and loss; fp32 = float32 everywhere; auto = bf16 where the CPU has AVX-512 BF16 or "
        "AMX-BF16, else fp32, resolved once at start (logged; config.yaml holds the resolved value). The megatron "
        "trainer runs fp32 only.",
    )
    bf16: bool = Field(False, description="Megatron's --bf16: the same as --precision bf16.")

    @model_validator(mode="before")
    @classmethod
    def _megatron_bf16(cls, data: Any) -> Any:
        """Megatron's --bf16 sets --precision bf16 (given with another --precision, `_bf16_agrees` refuses it)."""
        if not isinstance(data, dict) or not data.get("bf16") or data.get("precision", "auto") != "auto":
            return data
        return {**data, "precision": "bf16"}

    @field_validator("precision")
    @classmethod
    def _precision_the_trainer_runs(cls, value: str, info: ValidationInfo) -> str:
        if value == "bf16" and info.data.get("train_backend") == "megatron":
            raise ValueError(
                "bf16 (or --bf16) with --train-backend megatron: rollflow's megatron trainer runs float32 only; "
                "use --precision fp32 or auto (auto gives fp32 with it), or the torch trainer for bf16"
            )
        return value

    @field_validator("bf16")
    @classmethod
    def _bf16_agrees(cls, value: bool, info: ValidationInfo) -> bool:
        given = info.data.get("precision")
        if value and given is not None and given != "bf16":
            raise ValueError(f"--bf16 is --precision bf16, but --precision {given} is given too: give one")
        return value

    @model_validator(mode="after")
    def _check_slime_flags(self) -> TrainConfig:
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            raise ValueError("--use-dynamic-batch-size needs --max-tokens-per-gpu N")
        if self.recompute_granularity == "full":
            if self.recompute_method is None or self.recompute_num_layers is None:
                raise ValueError(
                    "--recompute-granularity full needs --recompute-method uniform|block and "
                    "--recompute-num-layers N (Megatron's rule)"
                )
        elif self.recompute_granularity == "selective" and self.recompute_num_layers is not None:
            raise ValueError(
                "--recompute-granularity selective takes no --recompute-num-layers (Megatron's rule)"
            )
        if self.optimizer_offload_dir is not None and self.train_backend == "megatron":
            raise ValueError(
                "--optimizer-offload-dir is the torch trainer's (--train-backend torch): the megatron trainer "
                "loads its AdamW state through megatron's distributed checkpoint, which would not put it on disk"
            )
        if self.optimizer_offload_dir is not None and self.optimizer != "adam":
            raise ValueError(
                "--optimizer-offload-dir keeps AdamW's moments on disk; --optimizer sgd has none to move: leave it out"
            )
        if self.kl_coef and self.kl_loss_coef:
            raise ValueError("--kl-coef and --kl-loss-coef: set only one of them (slime's rule)")
        return self


class CheckpointConfig(Section):
    """Saving and resuming."""

    save: str | None = Field(None, description="Directory for iter_XXXXXXX checkpoints.")
    save_interval: int | None = Field(
        None, ge=1, description="Save after every K rollouts (and the last one)."
    )
    load: str | None = Field(None, description="Resume from the latest checkpoint in this directory.")
    ci_save_model_hash: bool = Field(
        False, description="Write per-layer SHA-256 hashes next to every checkpoint."
    )
    ci_check_model_hash: bool = Field(
        False, description="After --load, check the loaded weights against the checkpoint's per-layer hashes."
    )
    no_verify_checkpoint: bool = Field(
        False,
        description="Skip the check of every tensor --load reads (and of --ref-load's weights) against the content "
        "hashes its --save recorded (for a checkpoint too large to hash at each load).",
    )


def check_steps_per_rollout(t: TrainConfig, samples_per_rollout: int) -> None:
    """--num-steps-per-rollout N sets the global batch to samples_per_rollout // N; a --global-batch-size
    that says otherwise is refused (slime's rule; a recipe's preset leaves the global batch to the step count)."""
    n = t.num_steps_per_rollout
    if n is None:
        return
    if n > samples_per_rollout:
        raise ValueError(
            f"--num-steps-per-rollout {n} exceeds the {samples_per_rollout} samples of a rollout "
            "(--rollout-batch-size x --n-samples-per-prompt)"
        )
    derived = samples_per_rollout // n
    given = t.global_batch_size
    if given is not None and given != derived:
        raise ValueError(
            f"--global-batch-size {given} disagrees with --num-steps-per-rollout {n}: "
            f"{samples_per_rollout} samples a rollout / {n} = {derived}; give one of the two"
        )


def check_parallelism(t: TrainConfig) -> None:
    """Parallelism the chosen backend cannot do is refused here, not silently ignored."""
    can = "tensor and data parallel" if t.train_backend == "megatron" else "data parallel"
    for flag, value in (
        ("--pipeline-model-parallel-size", t.pipeline_model_parallel_size),
        ("--context-parallel-size", t.context_parallel_size),
    ):
        if value > 1:
            raise ValueError(
                f"{flag} {value}: not supported yet (the {t.train_backend} backend runs {can} only); "
                "leave it at 1"
            )
    if t.train_backend != "megatron" and t.tensor_model_parallel_size > 1:
        raise ValueError(
            f"--tensor-model-parallel-size {t.tensor_model_parallel_size} needs --train-backend "
            f"megatron (the {t.train_backend} backend is data parallel only)"
        )
    if t.sequence_parallel and t.tensor_model_parallel_size > 1:
        raise ValueError(
            f"--sequence-parallel with --tensor-model-parallel-size {t.tensor_model_parallel_size}: rollflow's "
            "megatron trainer keeps whole sequences on each TP rank; drop --sequence-parallel (same results)"
        )
    if t.train_backend == "megatron":
        from importlib import metadata

        try:  # the installed distribution, not an import: megatron is only ever imported by its backend
            metadata.version("megatron-core")
        except metadata.PackageNotFoundError:
            raise ValueError(
                "--train-backend megatron needs megatron-core: install the extra, "
                "pip install 'rollflow[megatron]'"
            ) from None
