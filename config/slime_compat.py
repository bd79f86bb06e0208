"""How each flag of a slime launch line is taken (`bench/slime_compat.py` prints it for a script): what it means
here, the notice a run prints for the flags it keeps but does not act on, and the slime/Megatron flags rollflow
cannot honour, each refused with what to do instead of argparse's "unrecognized arguments"."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from config.run import RunConfig

# same: slime's meaning; checked: an architecture flag checked against config.json (config/arch.py);
# notice: kept in config.yaml, not acted on by this run, listed in the start-up notice
Status = Literal["same", "checked", "notice"]

_SAME: Status = "same"
_ARCH = (
    "num-layers hidden-size ffn-hidden-size num-attention-heads group-query-attention num-query-groups kv-channels "
    "vocab-size swiglu use-rotary-position-embeddings position-embedding-type rotary-base rotary-percent "
    "disable-bias-linear add-qkv-bias normalization norm-epsilon qk-layernorm untie-embeddings-and-output-weights"
).split()

# flag -> (status, what it means in rollflow where that needs saying); flags of slime's scripts
FLAGS: dict[str, tuple[Status, str]] = {
    **{f"--{name}": ("checked", "checked against config.json of --hf-checkpoint") for name in _ARCH},
    "--make-vocab-size-divisible-by": (_SAME, "padding only: padded rows never reach a log-prob"),
    "--max-position-embeddings": ("checked", "checked against config.json of --hf-checkpoint"),
    "--no-rope-fusion": (_SAME, "the trainers never fuse RoPE"),
    "--no-masked-softmax-fusion": (_SAME, "the trainers never fuse the softmax"),
    "--no-gradient-accumulation-fusion": (_SAME, "the trainers never fuse gradient accumulation"),
    "--attention-dropout": (_SAME, "0.0 only: the trainers never drop out"),
    "--hidden-dropout": (_SAME, "0.0 only: the trainers never drop out"),
    "--accumulate-allreduce-grads-in-fp32": (_SAME, "the trainers' gradients are float32 always"),
    "--attention-softmax-in-fp32": (_SAME, "the trainers' attention softmax is float32 always"),
    "--attention-backend": ("notice", "a kernel choice: the trainers' attention is fixed"),
    "--expert-model-parallel-size": (_SAME, "1 only: dense models"),
    "--expert-tensor-parallel-size": (_SAME, "1 only: dense models"),
    "--tensor-model-parallel-size": (_SAME, "above 1 on the megatron backend"),
    "--sequence-parallel": (_SAME, "a no-op at TP 1 (as in Megatron); refused above"),
    "--pipeline-model-parallel-size": (_SAME, "1 only"),
    "--context-parallel-size": (_SAME, "1 only"),
    "--actor-num-nodes": (_SAME, "x --actor-num-gpus-per-node = trainer ranks"),
    "--actor-num-gpus-per-node": (_SAME, "GPUs, or process slots on CPU; gives --data-parallel-size"),
    "--colocate": (
        _SAME,
        "--rollout-num-gpus = the trainer slots unless given; it does not turn on --offload-rollout as slime's does",
    ),
    "--offload-rollout": (
        _SAME,
        "the engines drop their weights from the log-prob stage until the weight sync",
    ),
    "--rollout-num-gpus-per-engine": (_SAME, "engine count = --rollout-num-gpus / this"),
    "--rollout-num-gpus": (_SAME, "slots of all engines"),
    "--use-wandb": (_SAME, "needs the wandb extra (pip install 'rollflow[wandb]')"),
    "--wandb-host": (_SAME, "the W&B server --wandb-key logs in to, online"),
    "--wandb-key": (_SAME, "sets WANDB_API_KEY; never written to config.yaml"),
    "--wandb-team": (_SAME, ""),
    "--wandb-project": (_SAME, ""),
    "--wandb-group": (_SAME, "also names a run on --prompt-data"),
    "--sglang-*": ("notice", "kept for an SGLang engine; the torch engine ignores them"),
    "--loss-type": (_SAME, "policy_loss, sft_loss or custom_loss (no value_loss: rollflow trains no critic)"),
    "--custom-loss-function-path": (
        _SAME,
        "slime's signature; logits are [B, T, V] response logits, read by trainers.custom_loss's "
        "get_log_probs_and_entropy",
    ),
    "--over-sampling-batch-size": (
        _SAME,
        "groups per draw; a draw is judged whole, in order (seeded, replayable)",
    ),
    "--dynamic-sampling-filter-path": (_SAME, "slime's filter_hub paths name rollflow's own filters"),
    "--buffer-filter-path": (
        _SAME,
        "serves a --rollout-function-path's given-back groups; the buffer lasts a rollout",
    ),
    "--custom-generate-function-path": (
        _SAME,
        "generates through rollout.engine_client.generate(args, payload) (SGLang's payload and answer) on the run's "
        "engines; import Sample from rollout.sample; one Sample back per call",
    ),
    "--rollout-function-path": (
        _SAME,
        "every sample of the rollout's groups comes back once; evals stay rollflow's; slime's default path is "
        "rollflow's own generation",
    ),
    "--group-rm": (_SAME, "a --custom-rm-path reward is called once per group, reward(args, samples)"),
}

# slime / Megatron flags with no rollflow meaning: the flag (or a prefix ending in '-') -> what to do instead
_DENSE = "rollflow's trainers and engine run dense Qwen2/Qwen3/Llama-family models: "
_PARTIAL = (
    "rollflow's engines finish every request of a draw (nothing is aborted once the batch is full), so no partial "
    "sample is left to continue in the next rollout; leave it out (dynamic sampling discards the last draw's "
    "surplus, as slime discards finished ones)"
)
_OPTIMIZER_STATE = (
    "rollflow's trainers keep their float32 AdamW state on the device (no CPU offload, no low-precision state); "
    "leave it out: the results are the same, the memory it saves is not. A CPU trainer's moments can leave memory "
    "for a file on disk instead: --optimizer-offload-dir DIR"
)
_TIS = "truncated importance sampling is not implemented in rollflow's losses; leave the TIS flags out"
_OFFLOAD_TRAIN = (
    "on one machine a colocated run peaks while the trainer steps, when its weights, gradients and AdamW state "
    "are resident (the engines' weights are released then with --offload-rollout; --optimizer-offload-dir keeps "
    "the AdamW moments on disk, in memory only a chunk at a time as a step updates them); spilling the trainer's "
    "state while the engines generate would lower only the generation phase, which is below that peak already, "
    "and cost a write and read of the state every rollout. The trainers drop their gradients after every step "
    "anyway. Leave it out; --offload-rollout releases the engines' weights"
)
REFUSED: dict[str, str] = {
    "--moe-": _DENSE + "leave out the MoE flags (--num-experts, --moe-*) and use a dense checkpoint",
    "--num-experts": _DENSE + "leave out the MoE flags (--num-experts, --moe-*) and use a dense checkpoint",
    "--multi-latent-attention": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--q-lora-rank": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--kv-lora-rank": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--qk-head-dim": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--v-head-dim": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--qk-pos-emb-head-dim": _DENSE + "leave out the MLA flags and use a model with standard attention",
    "--mtp-num-layers": "multi-token prediction layers are not trained by rollflow; leave it out",
    "--spec": "rollflow builds its own Megatron layer spec from config.json; leave --spec out",
    "--use-gated-attention": _DENSE + "gated attention is not among them; leave it out",
    "--attention-output-gate": _DENSE + "gated attention is not among them; leave it out",
    "--use-precision-aware-optimizer": _OPTIMIZER_STATE,
    "--optimizer-cpu-offload": _OPTIMIZER_STATE,
    "--overlap-cpu-optimizer-d2h-h2d": _OPTIMIZER_STATE,
    "--use-tis": _TIS,
    "--tis-clip": _TIS,
    "--tis-clip-low": _TIS,
    "--custom-tis-function-path": _TIS,
    "--num-epoch": "give --num-rollout N instead (slime's: epochs x prompts / --rollout-batch-size)",
    "--rollout-max-context-len": "give --rollout-max-response-len instead (prompt + response must fit the model's "
    "max_position_embeddings, checked before the run)",
    "--lr-warmup-fraction": "give --lr-warmup-iters N (optimizer steps of warm-up) instead",
    "--offload": "--offload is --offload-rollout plus --offload-train, and rollflow refuses --offload-train (see "
    "it): give --offload-rollout",
    "--offload-train": _OFFLOAD_TRAIN,
    "--fp16": "rollflow's engines and trainers run bfloat16 or float32 (--precision): float16 training needs "
    "loss scaling, which the trainers do not have, and CPUs have no float16 arithmetic; use --bf16 "
    "(--precision bf16) or --precision auto",
    "--partial-rollout": _PARTIAL,
    "--mask-offpolicy-in-partial-rollout": _PARTIAL,
}


# rollout fields slime gives no default (required, or SGLang's limit): a run on --prompt-data that leaves them unset
# is told the values it takes
NO_SLIME_DEFAULT = {
    "num_rollout": "slime requires it or --num-epoch",
    "rollout_batch_size": "slime requires it",
    "rollout_max_response_len": "slime leaves it to SGLang: up to the context",
}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def refusal(flag: str) -> str | None:
    """What to do instead of `flag`, when it is a slime/Megatron flag rollflow cannot honour."""
    if flag in REFUSED:
        return REFUSED[flag]
    for prefix, why in REFUSED.items():
        if prefix.endswith("-") and flag.startswith(prefix):
            return why
    return None


def unknown_flag(flag: str, known: list[str]) -> str:
    """The one-line error for a flag `rollflow run` does not have: what to do instead for a known slime flag,
    else the closest flag's name."""
    why = refusal(flag)
    if why:
        return f"{flag}: not supported: {why}"
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
    hint = f": did you mean {close[0]}?" if close else ""
    return f"unrecognized flag {flag}{hint} (rollflow run --help lists every flag)"


def notices(cfg: RunConfig) -> list[str]:
    """The start-up notice: one line per concern, for the flags this run keeps but does not act on."""
    lines = []
    given = cfg.sglang.given()
    if given and cfg.rollout.rollout_backend != "sglang":
        lines.append(
            f"the {cfg.rollout.rollout_backend} engine ignores {', '.join(given)} (kept in config.yaml for an "
            "SGLang engine)"
        )
    unset = [
        f"{flag_of(name)} {getattr(cfg.rollout, name)} ({why})"
        for name, why in NO_SLIME_DEFAULT.items()
        if cfg.data.prompt_data is not None and name not in cfg.rollout.model_fields_set
    ]
    if unset:
        lines.append(f"not given, so rollflow's defaults: {', '.join(unset)}; set them for your data")
    if cfg.arch.attention_backend is not None:
        trainer = (
            "the HF model's attention" if cfg.train.train_backend == "torch" else "megatron's local spec"
        )
        lines.append(
            f"--attention-backend {cfg.arch.attention_backend} is a kernel choice the {cfg.train.train_backend} "
            f"trainer does not have: it runs {trainer} (same results)"
        )
    unused = [
        flag_of(name)
        for name in ("dynamic_sampling_filter_path", "over_sampling_batch_size")
        if getattr(cfg.sampling, name) is not None
    ]
    if unused and cfg.rollout.rollout_function_path is not None:
        lines.append(
            f"{' and '.join(unused)} not applied: --rollout-function-path draws the rollout's groups itself "
            "(as in slime, where the default rollout function applies them)"
        )
    return lines
