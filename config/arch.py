"""The model as Megatron builds it: slime's MODEL_ARGS (`scripts/models/*.sh`) and the model-level MISC_ARGS.

rollflow reads a model's shape from its HF `config.json`, so these flags set nothing: each one given is checked
against the config.json of `--hf-checkpoint` when the checkpoint is resolved (`check_arch`), and a mismatch is
refused naming the flag, both values and the file. A flag left out is not checked. The numeric precision and
kernel switches are what rollflow's trainers always do (float32 unless --precision bf16, no dropout): accepted,
with that meaning stated here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from config.base import Section

# model_type -> whether its HF implementation has the property; a type not listed is not checked
_QK_NORM = {
    "qwen3": True,
    "qwen3_moe": True,
    "qwen2": False,
    "qwen2_moe": False,
    "llama": False,
    "mistral": False,
}
_GATED_MLP = {"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral"}  # gate_proj * act(up_proj)


class ArchConfig(Section):
    """Megatron's model flags (slime's MODEL_ARGS), checked against the HF config.json; unset = not checked."""

    num_layers: int | None = Field(
        None, ge=1, description="Decoder layers; checked against num_hidden_layers."
    )
    hidden_size: int | None = Field(None, ge=1, description="Model width; checked against hidden_size.")
    ffn_hidden_size: int | None = Field(
        None, ge=1, description="MLP hidden size; checked against intermediate_size."
    )
    num_attention_heads: int | None = Field(
        None, ge=1, description="Query heads; checked against num_attention_heads."
    )
    group_query_attention: bool = Field(
        False,
        description="Grouped-query attention with --num-query-groups key/value heads (Megatron: 1 when that is "
        "not given); checked against num_key_value_heads.",
    )
    num_query_groups: int | None = Field(
        None,
        ge=1,
        description="Key/value heads under --group-query-attention (Megatron ignores it without that flag: one "
        "key/value head per query head); checked against num_key_value_heads.",
    )
    kv_channels: int | None = Field(
        None,
        ge=1,
        description="Per-head dim; checked against head_dim (else hidden_size / num_attention_heads).",
    )
    vocab_size: int | None = Field(
        None,
        ge=1,
        description="Vocabulary before Megatron pads it; checked against vocab_size (the embedding rows of the "
        "HF checkpoint, which slime's scripts give here). The trainers pad it themselves.",
    )
    make_vocab_size_divisible_by: int | None = Field(
        None,
        ge=1,
        description="Megatron's vocabulary padding; not checked: padded rows never reach a log-prob (the "
        "megatron backend pads to a multiple of the TP size and drops the extra logits, as slime strips them).",
    )
    swiglu: bool = Field(
        False, description="Gated SiLU MLP; checked against hidden_act silu in a gated-MLP model type."
    )
    use_rotary_position_embeddings: bool = Field(
        False,
        description="RoPE; checked against the rope settings of config.json (rope_theta / rope_parameters).",
    )
    position_embedding_type: Literal["rope", "learned_absolute", "none"] | None = Field(
        None,
        description="Megatron's position embedding; rope is checked as --use-rotary-position-embeddings.",
    )
    rotary_base: float | None = Field(
        None, gt=0, description="RoPE theta; checked against rope_parameters.rope_theta or rope_theta."
    )
    rotary_percent: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Rotary share of each head; checked against partial_rotary_factor (1.0).",
    )
    disable_bias_linear: bool = Field(
        False,
        description="No bias on the attention output and MLP projections; checked against the model type "
        "(Qwen2/3: none; Llama/Mistral: attention_bias and mlp_bias false).",
    )
    add_qkv_bias: bool = Field(
        False,
        description="Biases on q/k/v; checked against the model type (Qwen2: always; Qwen3/Llama: attention_bias).",
    )
    normalization: Literal["LayerNorm", "RMSNorm"] | None = Field(
        None, description="Norm layers; checked against rms_norm_eps (RMSNorm) or layer_norm_eps (LayerNorm)."
    )
    norm_epsilon: float | None = Field(
        None, gt=0, description="Norm epsilon; checked against rms_norm_eps / layer_norm_eps."
    )
    qk_layernorm: bool = Field(
        False,
        description="RMSNorm on each head's query and key; checked against the model type (Qwen3: yes).",
    )
    untie_embeddings_and_output_weights: bool = Field(
        False, description="Separate output layer; checked against tie_word_embeddings false."
    )
    max_position_embeddings: int | None = Field(
        None, ge=1, description="Positions of the rotary tables; checked against max_position_embeddings."
    )
    no_rope_fusion: bool = Field(False, description="Unfused RoPE: what both trainers always run.")
    no_masked_softmax_fusion: bool = Field(
        False, description="Unfused masked softmax: what both trainers always run."
    )
    no_gradient_accumulation_fusion: bool = Field(
        False,
        description="Gradients accumulated without Megatron's fused kernel: what both trainers always do.",
    )
    attention_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Attention dropout; rollflow's models never drop out (the log-prob pass and the train step "
        "must see the same forward), so only 0.0 is accepted (Megatron's default is 0.1; slime's scripts set 0).",
    )
    hidden_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Hidden-state dropout; only 0.0 is accepted, as --attention-dropout."
    )
    attention_softmax_in_fp32: bool = Field(
        False,
        description="Attention softmax in float32: what both trainers always do (their weights and activations "
        "are float32), so it changes nothing.",
    )
    accumulate_allreduce_grads_in_fp32: bool = Field(
        False,
        description="Gradients accumulated and reduced in float32: what both trainers always do, so it changes "
        "nothing.",
    )
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] | None = Field(
        None,
        description="Megatron's attention kernel, a speed choice: rollflow's megatron trainer always runs "
        "megatron's local (unfused) layer spec and the torch trainer the HF model's attention, whatever this "
        "says (listed in the start-up notice).",
    )
    expert_model_parallel_size: int = Field(
        1, ge=1, description="Expert parallelism; rollflow's models are dense (no experts), so only 1."
    )
    expert_tensor_parallel_size: int | None = Field(
        None, ge=1, description="Tensor parallelism of the experts; dense models have none, so only 1."
    )

    @field_validator("attention_dropout", "hidden_dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value:
            raise ValueError(
                f"{value}: rollflow's trainers run without dropout (the old-policy log-probs and the train step "
                "must see the same forward); set 0.0 or leave it out"
            )
        return value

    @field_validator("expert_model_parallel_size", "expert_tensor_parallel_size")
    @classmethod
    def _dense(cls, value: int | None) -> int | None:
        if value is not None and value > 1:
            raise ValueError(
                f"{value}: rollflow's trainers run dense models (no experts to split); leave it at 1 and use "
                "--data-parallel-size / --tensor-model-parallel-size"
            )
        return value


def hf_values(hf: dict[str, Any]) -> dict[str, Any]:
    """What each ArchConfig flag must be for the model of `hf` (a config.json mapping; a multimodal one's
    text_config is used); a flag whose value the config does not tell is left out."""
    if isinstance(hf.get("text_config"), dict):
        hf = hf["text_config"]
    out: dict[str, Any] = {}
    model_type = hf.get("model_type")
    for flag_name, key in (
        ("num_layers", "num_hidden_layers"),
        ("hidden_size", "hidden_size"),
        ("ffn_hidden_size", "intermediate_size"),
        ("num_attention_heads", "num_attention_heads"),
        ("vocab_size", "vocab_size"),
        ("max_position_embeddings", "max_position_embeddings"),
    ):
        if hf.get(key) is not None:
            out[flag_name] = hf[key]
    heads = hf.get("num_attention_heads")
    if heads is not None:
        out["num_query_groups"] = hf.get("num_key_value_heads") or heads
    if hf.get("head_dim") is not None:
        out["kv_channels"] = hf["head_dim"]
    elif heads and hf.get("hidden_size") is not None:
        out["kv_channels"] = hf["hidden_size"] // heads
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta")) if isinstance(rope, dict) else hf.get("rope_theta")
    if theta is not None:
        out["rotary_base"] = theta
    if theta is not None or rope:
        out["use_rotary_position_embeddings"] = True
        out["rotary_percent"] = hf.get("partial_rotary_factor", 1.0)
    if "rms_norm_eps" in hf:
        out["normalization"], out["norm_epsilon"] = "RMSNorm", hf["rms_norm_eps"]
    elif "layer_norm_eps" in hf or "layer_norm_epsilon" in hf:
        out["normalization"] = "LayerNorm"
        out["norm_epsilon"] = hf.get("layer_norm_eps", hf.get("layer_norm_epsilon"))
    act = hf.get("hidden_act")
    if act is not None and act != "silu":
        out["swiglu"] = False
    elif model_type in _GATED_MLP:
        out["swiglu"] = True
    attention_bias = bool(hf.get("attention_bias", False))
    if model_type in ("qwen2", "qwen2_moe"):  # q/k/v biases always, none elsewhere
        out["add_qkv_bias"], out["disable_bias_linear"] = True, True
    elif model_type in ("qwen3", "qwen3_moe"):  # attention_bias puts a bias on q/k/v and o
        out["add_qkv_bias"], out["disable_bias_linear"] = attention_bias, not attention_bias
    elif model_type in ("llama", "mistral"):
        out["add_qkv_bias"] = attention_bias
        out["disable_bias_linear"] = not (attention_bias or hf.get("mlp_bias", False))
    if model_type in _QK_NORM:
        out["qk_layernorm"] = _QK_NORM[model_type]
    if "tie_word_embeddings" in hf:
        out["untie_embeddings_and_output_weights"] = not hf["tie_word_embeddings"]
    return out


def check_arch(arch: ArchConfig, hf: dict[str, Any], where: str) -> None:
    """Refuse the first flag given in `arch` that disagrees with `hf` (the config.json at `where`): ValueError
    naming the flag, its value, the config's value and the file."""
    want = hf_values(hf)
    given = arch.model_fields_set
    checks: list[tuple[str, Any, str]] = []  # (flag, its value, the field of want it must equal)
    for name in (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "kv_channels",
        "vocab_size",
        "max_position_embeddings",
        "rotary_base",
        "rotary_percent",
        "normalization",
        "norm_epsilon",
    ):
        if name in given and getattr(arch, name) is not None:
            checks.append((name, getattr(arch, name), name))
    for name in (
        "swiglu",
        "use_rotary_position_embeddings",
        "disable_bias_linear",
        "add_qkv_bias",
        "qk_layernorm",
        "untie_embeddings_and_output_weights",
    ):
        if getattr(arch, name):  # a store_true flag left out means "not given" here, not False
            checks.append((name, True, name))
    if arch.position_embedding_type is not None:
        checks.append(
            (
                "position_embedding_type",
                arch.position_embedding_type == "rope",
                "use_rotary_position_embeddings",
            )
        )
    if arch.group_query_attention or arch.num_query_groups is not None:
        heads = arch.num_attention_heads or want.get("num_attention_heads")
        groups = (arch.num_query_groups or 1) if arch.group_query_attention else heads
        name = "num_query_groups" if arch.num_query_groups is not None else "group_query_attention"
        checks.append((name, groups, "num_query_groups"))
    for name, value, key in checks:
        if key not in want or _same(value, want[key]):
            continue
        flag = "--" + name.replace("_", "-")
        shown = _shown(name, value, arch)
        raise ValueError(
            f"{flag}{shown} disagrees with the model: {_hf_key(key, hf)} is {want[key]!r} in {where}; fix the flag "
            "or drop it (rollflow reads the architecture from config.json)"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= 1e-12 * max(abs(float(a)), abs(float(b)))
    return bool(a == b)


def _shown(name: str, value: Any, arch: ArchConfig) -> str:
    """The flag's value as the message quotes it (store_true flags have none)."""
    if name == "group_query_attention":
        return " (Megatron: 1 key/value head without --num-query-groups)"
    if name == "num_query_groups" and not arch.group_query_attention:
        return f" {arch.num_query_groups} without --group-query-attention (Megatron: {value} key/value heads)"
    if isinstance(value, bool) and name != "position_embedding_type":
        return ""
    if name == "position_embedding_type":
        return f" {arch.position_embedding_type}"
    return f" {value}"


_HF_KEYS = {
    "num_layers": "num_hidden_layers",
    "ffn_hidden_size": "intermediate_size",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "rotary_base": "rope_theta",
    "rotary_percent": "partial_rotary_factor",
    "norm_epsilon": "rms_norm_eps",
    "untie_embeddings_and_output_weights": "not tie_word_embeddings",
    "use_rotary_position_embeddings": "rotary (rope_theta present)",
    "swiglu": "a gated SiLU MLP (hidden_act)",
    "disable_bias_linear": "no o_proj/MLP bias",
    "add_qkv_bias": "q/k/v bias",
    "qk_layernorm": "q/k norm",
    "normalization": "the norm (rms_norm_eps / layer_norm_eps)",
}


def _hf_key(key: str, hf: dict[str, Any]) -> str:
    name = _HF_KEYS.get(key, key)
    if key == "norm_epsilon" and "rms_norm_eps" not in hf:
        name = "layer_norm_eps"
    if key == "kv_channels" and "head_dim" not in hf:
        name = "hidden_size / num_attention_heads"
    model_type = hf.get("model_type")
    if key in ("qk_layernorm", "add_qkv_bias", "disable_bias_linear", "swiglu") and model_type:
        name += f" of model_type {model_type!r}"
    return name
