"""What to generate and how: the rollout, its prompt data, the reward, and the eval."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from config.backends import ENGINES
from config.base import SEED_MAX, Section

# the engine choices are the registry's keys (an unregistered backend is refused at parse time)
RolloutBackend = Literal[tuple(ENGINES)]  # type: ignore[valid-type]


class RolloutConfig(Section):
    """What to generate each rollout and how to sample it."""

    num_rollout: int = Field(
        100, ge=1, le=10_000_000, description="Number of rollouts (RL iterations) in the run."
    )
    rollout_batch_size: int = Field(128, ge=1, le=1_000_000, description="Prompts per rollout.")
    n_samples_per_prompt: int = Field(
        1,
        ge=1,
        le=65_536,
        description="Responses sampled per prompt (the GRPO group size; slime's default 1).",
    )
    rollout_max_response_len: int = Field(6, ge=1, le=10_000_000, description="Max new tokens per response.")
    rollout_temperature: float = Field(1.0, gt=0.0, description="Sampling temperature.")
    rollout_top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    rollout_top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 disables it.")
    rollout_seed: int = Field(
        42,
        ge=0,
        le=SEED_MAX,
        description="Seed of the prompt order and of every per-sample sampling seed.",
    )
    rollout_stop: list[str] | None = Field(
        None,
        description="Stop strings: one that is a single token of the tokenizer becomes a stop token id, a "
        "longer one ends the response where the decoded text first contains it.",
    )
    rollout_stop_token_ids: list[int] | None = Field(
        None,
        description="Stop token ids, added to the defaults (the tokenizer's EOS and the chat template's "
        "end-of-turn token).",
    )
    rollout_backend: RolloutBackend = Field("torch", description="Inference engine backend.")  # type: ignore[valid-type]
    rollout_num_engines: int = Field(
        1,
        ge=1,
        le=4096,
        description="Engine actors; prompt groups are spread over them. Unset, --rollout-num-gpus "
        "/ --rollout-num-gpus-per-engine gives it.",
    )
    rollout_num_gpus: int | None = Field(
        None,
        ge=1,
        le=65_536,
        description="Slots of all engines (slime's flag: GPUs, or processes on CPU); None = "
        "--rollout-num-engines x --rollout-num-gpus-per-engine.",
    )
    rollout_num_gpus_per_engine: int = Field(
        1,
        ge=1,
        le=1024,
        description="Slots of one engine (slime's flag: its tensor-parallel GPUs); the engine actor "
        "sits in the first, the rest are reserved for its own processes.",
    )

    custom_generate_function_path: str | None = Field(
        None,
        description="Dotted path module.fn of slime's generate plug-in, `async def generate(args, sample, "
        "sampling_params) -> Sample | list[Sample]`, called per sample instead of one engine call (multi-turn, "
        "tool calls); it generates through rollout.engine_client (see examples/calculator_tool).",
    )
    rollout_function_path: str | None = Field(
        None,
        description="Dotted path module.fn of slime's rollout function, `generate_rollout(args, rollout_id, "
        "data_source, evaluation=False)` returning groups of samples, which replaces the whole rollout's "
        "generation (see examples/rollout_function); slime's own default path means rollflow's generation.",
    )

    @model_validator(mode="before")
    @classmethod
    def _engines_from_slots(cls, data: Any) -> Any:
        """slime's launch line gives --rollout-num-gpus and no engine count: the count follows from it. When both
        are given, RunConfig refuses a contradiction (config/placement.py)."""
        if not isinstance(data, dict) or "rollout_num_engines" in data:
            return data
        slots, per_engine = data.get("rollout_num_gpus"), data.get("rollout_num_gpus_per_engine", 1)
        if (
            isinstance(slots, int)
            and isinstance(per_engine, int)
            and per_engine > 0
            and slots % per_engine == 0
        ):
            return {**data, "rollout_num_engines": slots // per_engine}
        return data  # not whole numbers, or not a whole number of engines: the field checks say so

    @property
    def rollout_slots(self) -> int:
        """Slots of all engines: --rollout-num-gpus, else one engine's share times the engines."""
        return self.rollout_num_gpus or self.rollout_num_engines * self.rollout_num_gpus_per_engine


class EvalConfig(Section):
    """Held-out evaluation."""

    eval_interval: int | None = Field(
        None,
        ge=1,
        description="Evaluate every N rollouts (and at rollout 0 and after the last); None disables eval "
        "(slime's default; the recipes evaluate every 10).",
    )
    n_samples_per_eval_prompt: int = Field(
        1,
        ge=1,
        description="Samples per eval prompt (slime's default 1; the recipes take 4, which keeps tiny-arith's "
        "eval noise near one point).",
    )
    eval_temperature: float | None = Field(
        None, gt=0.0, description="Eval sampling temperature; None = rollout's."
    )
    eval_top_p: float | None = Field(None, gt=0.0, le=1.0, description="Eval nucleus mass; None = rollout's.")
    eval_top_k: int | None = Field(None, ge=-1, description="Eval top-k; None = rollout's.")
    eval_max_response_len: int | None = Field(
        None, ge=1, le=10_000_000, description="Eval max new tokens; None = rollout's."
    )


class DataConfig(Section):
    """Prompt data (slime's flags and meanings). Unset, the recipe supplies data, keys and eval set."""

    prompt_data: str | None = Field(
        None,
        description="Training prompts: a .jsonl or .parquet file, one row per prompt; None = the recipe's.",
    )
    input_key: str = Field(
        "input",
        description="Row key of the prompt: a string, or chat messages "
        "[{role, content}] (those need --apply-chat-template).",
    )
    label_key: str | None = Field(None, description="Row key of the label handed to the reward.")
    metadata_key: str = Field(
        "metadata",
        description="Row key of a JSON object carried into each sample's metadata and handed to the reward.",
    )
    tool_key: str = Field(
        "tools", description="Row key of tool schemas passed to the chat template (if present)."
    )
    apply_chat_template: bool = Field(
        False,
        description="Render the prompt with the tokenizer's chat template "
        "(a string input becomes one user message).",
    )
    apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="JSON object of extra keyword arguments for the chat template."
    )
    rollout_shuffle: bool = Field(
        False,
        description="Visit prompts in a per-epoch permutation seeded by --rollout-seed + epoch (else file "
        "order); the tiny-arith preset turns it on.",
    )
    rollout_max_prompt_len: int | None = Field(
        None, ge=1, description="Drop prompts longer than this many tokens at load (the count is logged)."
    )
    eval_prompt_data: list[str] | None = Field(
        None,
        description="NAME PATH [NAME PATH ...]: eval datasets, each logged as eval/NAME; None = the recipe's "
        "(when it supplies the training data too).",
    )
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


class RewardConfig(Section):
    """How a response is scored (slime's flags): a built-in --rm-type or your --custom-rm-path."""

    rm_type: str | None = Field(
        None,
        description="Built-in reward: slime's math, deepscaler, dapo, f1, gpqa, remote_rm (with --rm-url), random "
        "(scored as slime scores them), or exact_match, tiny-arith, long-arith; a boxed_ prefix scores the last "
        "\\boxed{...}; None = the recipe's when it supplies the data.",
    )
    custom_rm_path: str | None = Field(
        None,
        description="Dotted path module.fn of your reward (sync or async), importable from the working "
        "directory or PYTHONPATH; wins over --rm-type.",
    )
    reward_key: str | None = Field(
        None, description="When the reward returns a dict: the key of the scalar reward."
    )
    group_rm: bool = Field(
        False,
        description="Score each prompt group with one call: a --custom-rm-path reward is called as "
        "reward(args, samples) and returns one reward per sample (slime's --group-rm).",
    )
    eval_reward_key: str | None = Field(None, description="--reward-key for eval; None = --reward-key.")
    rm_url: str | None = Field(
        None,
        description="URL of the reward server of --rm-type remote_rm: each sample is POSTed to it as JSON "
        "{prompt, response, label} and its JSON answer is the reward (slime's).",
    )
    rm_timeout: float | None = Field(
        5.0,
        gt=0,
        le=86_400,
        description="Seconds one call of the --custom-rm-path reward (or one remote_rm request, retries "
        "included) may take for one sample before it is abandoned and the sample marked failed, with a warning; "
        "None = no limit (a custom reward then runs on the rollout actor's main thread, as a reward that sets "
        "signal.alarm itself needs). Unset: 5 for a --custom-rm-path reward, None for a built-in --rm-type, so "
        "remote_rm is bounded as slime bounds it (each attempt 120 s, up to 10 attempts with backoff).",
    )

    @model_validator(mode="after")
    def _remote_rm_bound(self) -> RewardConfig:
        """A built-in reward given no --rm-timeout gets none (still counted as not given): the rules return at
        once, and remote_rm keeps slime's own per-attempt timeout and retries, which the 5 s meant for a custom
        reward would cut short."""
        if "rm_timeout" not in self.model_fields_set and not self.custom_rm_path:
            object.__setattr__(self, "rm_timeout", None)  # frozen: set as the field's value for this reward
        return self
