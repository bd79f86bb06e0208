"""The flat values a trainer backend receives: its section of the run configuration, read in one place
(`trainer_settings`, called where the actors are created), so no backend ever reaches into the run config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from config import RunConfig
from config.precision import concrete
from rollout.slime_args import slime_args


@dataclass(frozen=True)
class TrainerSettings:
    """Everything a trainer backend depends on (see config/ for each flag's meaning)."""

    tensor_model_parallel_size: int
    seed: int
    num_threads: int
    # batch schedule
    global_batch_size: int
    micro_batch_size: int
    total_steps: int
    temperature: float
    # optimiser and LR schedule
    lr: float
    min_lr: float
    lr_warmup_iters: int
    lr_decay_style: str
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    clip_grad: float
    # RL loss
    advantage_estimator: str
    normalize_std: bool
    policy_loss: str
    eps_clip: float
    eps_clip_high: float
    eps_clip_c: float | None
    entropy_coef: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    use_rollout_logprobs: bool
    fuse_first_step: bool  # the log-prob pass also runs the first step's forward/backward (see TrainerCore)
    loss_type: str  # slime's --loss-type (trainers/custom_loss.py for the non-policy ones)
    custom_loss_function_path: str | None
    plugin_args: dict[str, Any]  # slime's `args` (rollout/slime_args.py) as a loss plug-in receives them
    # debugging, checks and checkpoints
    deterministic_collective: bool
    disable_optimizer: bool
    need_ref_model: bool
    ref_load: str | None
    save_model_hash: bool
    check_model_hash: bool
    verify_checkpoint: bool  # --load checks the tensors it reads against the hashes their --save recorded
    config_hash: str
    run_dir: str  # the rendezvous file store (one machine) lives under it
    # slime's batching, loss, advantage, optimizer and memory flags (config/train.py)
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: int | None = None
    balance_data: bool = False
    per_token_loss: bool = False
    kl_coef: float = 0.0
    normalize_advantages: bool = False
    optimizer: str = "adam"
    sgd_momentum: float = 0.9
    optimizer_offload_dir: str | None = None  # absolute: the actors' working directory is not the driver's
    deterministic_mode: bool = False
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    allow_model_dropout: bool = False
    ci_reexecute: bool = False  # --ci-test's re-execution check (trainers/determinism.py)
    # bf16: forward under CPU autocast to bfloat16 (float32 master weights, optimizer state and log-probs), and the
    # engines hold bfloat16 weights (what the weight hashes compare against); fp32: float32 throughout
    precision: str = "fp32"


def trainer_settings(cfg: RunConfig) -> TrainerSettings:
    """A trainer's view of `cfg`."""
    t, ci = cfg.train, cfg.ci
    return TrainerSettings(
        tensor_model_parallel_size=t.tensor_model_parallel_size,
        seed=t.seed,
        num_threads=cfg.num_threads,
        global_batch_size=cfg.global_batch_size,
        micro_batch_size=cfg.micro_batch_size,
        total_steps=cfg.rollout.num_rollout * cfg.steps_per_rollout,
        temperature=cfg.rollout.rollout_temperature,
        lr=t.lr,
        min_lr=t.min_lr,
        lr_warmup_iters=t.lr_warmup_iters,
        lr_decay_style=t.lr_decay_style,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        clip_grad=t.clip_grad,
        advantage_estimator=t.advantage_estimator,
        normalize_std=not t.disable_grpo_std_normalization,
        policy_loss=t.policy_loss,
        eps_clip=t.eps_clip,
        eps_clip_high=t.eps_clip_high or t.eps_clip,
        eps_clip_c=t.eps_clip_c,
        entropy_coef=t.entropy_coef,
        use_kl_loss=t.use_kl_loss,
        kl_loss_coef=t.kl_loss_coef,
        kl_loss_type=t.kl_loss_type,
        use_rollout_logprobs=t.use_rollout_logprobs,
        # the --ci-test KL checker compares the first step's log-probs with those of a separate forward
        fuse_first_step=not (
            cfg.debug.debug_separate_logprob_pass
            or (ci.ci_test and not ci.ci_disable_kl_checker)
            or cfg.loss.loss_type != "policy_loss"  # a plug-in loss needs the logits, not the fused outputs
        ),
        loss_type=cfg.loss.loss_type,
        custom_loss_function_path=cfg.loss.custom_loss_function_path,
        plugin_args=vars(slime_args(cfg)),
        deterministic_collective=cfg.debug.debug_deterministic_collective,
        disable_optimizer=cfg.debug.debug_disable_optimizer,
        # the --ci-test log-prob checker compares with the reference model's log-probs
        need_ref_model=t.use_kl_loss or (ci.ci_test and not ci.ci_disable_logprobs_checker),
        ref_load=cfg.ref_load,
        save_model_hash=cfg.checkpoint.ci_save_model_hash,
        check_model_hash=cfg.checkpoint.ci_check_model_hash,
        verify_checkpoint=not cfg.checkpoint.no_verify_checkpoint,
        config_hash=cfg.config_hash(),
        run_dir=str(cfg.resolved_run_dir),
        use_dynamic_batch_size=t.use_dynamic_batch_size,
        max_tokens_per_gpu=t.max_tokens_per_gpu,
        balance_data=t.balance_data,
        per_token_loss=t.calculate_per_token_loss,
        kl_coef=t.kl_coef,
        normalize_advantages=t.normalize_advantages,
        optimizer=t.optimizer,
        sgd_momentum=t.sgd_momentum,
        optimizer_offload_dir=os.path.abspath(t.optimizer_offload_dir) if t.optimizer_offload_dir else None,
        deterministic_mode=t.deterministic_mode,
        recompute_granularity=t.recompute_granularity,
        recompute_method=t.recompute_method,
        recompute_num_layers=t.recompute_num_layers,
        allow_model_dropout=cfg.debug.allow_model_dropout,
        ci_reexecute=ci.ci_test and not ci.ci_disable_reexecution_checker,
        precision=concrete(t.precision, t.train_backend),
    )
