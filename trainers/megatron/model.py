"""Megatron-core process groups and the GPTModel of an HF Qwen2/Qwen3/Llama architecture.

The model uses megatron's local layer spec (no Transformer Engine or Apex needed): RMSNorm, GQA
self-attention with optional q/k/v bias and optional per-head q/k RMSNorm (Qwen3), RoPE, SwiGLU MLP, tied or
untied output layer, float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer import TransformerConfig

from trainers.megatron import convert, cpu_patches
from trainers.megatron.arch import ModelArch


def init_parallel(tp_size: int, seed: int, device: torch.device) -> None:
    """Megatron's parallel state over the already initialised default process group: TP groups of
    `tp_size` consecutive ranks, data parallel across them (megatron's default order tp-cp-ep-dp-pp).
    Re-entrant for the same TP size (several trainers in one test process share the state)."""
    if parallel_state.model_parallel_is_initialized():
        held = parallel_state.get_tensor_model_parallel_world_size()
        if held != tp_size:
            raise RuntimeError(
                f"megatron parallel state already holds TP={held}, asked for TP={tp_size} in this process"
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp_size, create_gloo_process_groups=False
        )
    if device.type == "cuda":
        if cpu_patches.applied():
            raise RuntimeError(
                "this process already runs megatron on the CPU (its CPU patches are installed); "
                "run the CUDA model in another process"
            )
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        cpu_patches.apply()
        # fork() of this tracker is a no-op rather than a swap of CUDA generator states; with dropout
        # refused (ModelArch) no forward draws random numbers, so nothing depends on the tracker
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


@dataclass(frozen=True)
class Memory:
    """slime's recompute and determinism flags, passed to megatron's TransformerConfig as they are."""

    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    deterministic_mode: bool = False


def transformer_config(
    arch: ModelArch, tp_size: int, device: torch.device, memory: Memory = Memory()
) -> TransformerConfig:
    """The TransformerConfig equal to the HF model: no dropout, no fused kernels (none exist on the CPU,
    and the unfused ones are what reproduces the HF forward within float32 rounding)."""
    return TransformerConfig(
        recompute_granularity=memory.recompute_granularity,
        recompute_method=memory.recompute_method,
        recompute_num_layers=memory.recompute_num_layers,
        deterministic_mode=memory.deterministic_mode,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_layernorm,  # RMSNorm (`normalization`) over each head, as HF Qwen3's q_norm/k_norm
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        tensor_model_parallel_size=tp_size,
        sequence_parallel=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=device.type == "cpu",
        # the weights are overwritten from the HF checkpoint right after construction
        perform_initialization=False,
    )


def build_model(arch: ModelArch, tp_size: int, device: torch.device, memory: Memory = Memory()) -> GPTModel:
    """This TP rank's GPTModel (parameters uninitialised: load converted weights into it)."""
    config = transformer_config(arch, tp_size, device, memory)
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(
            normalization="RMSNorm", qk_layernorm=arch.qk_layernorm
        ),
        vocab_size=arch.padded_vocab(tp_size),
        max_sequence_length=arch.max_position_embeddings,
        pre_process=True,
        post_process=True,
        parallel_output=True,  # vocab-parallel logits; the trainer gathers only the rows it needs
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=arch.rope_theta,  # annotated int upstream; used as a float there too
    )
    # megatron's parallel layers tag their weights as TP-sharded only when they initialise them themselves
    # (perform_initialization), which is skipped here; the grad norm reads the tag to count replicated
    # parameters (RMSNorm weights) once, so set it from the layout the converter shards by
    for name, param in model.named_parameters():
        dim = convert.tp_split_dim(name, arch)
        if hasattr(param, "tensor_model_parallel"):  # biases and the embedding are tagged regardless
            if bool(param.tensor_model_parallel) != (dim is not None):
                raise RuntimeError(
                    f"{name}: megatron tags it tensor_model_parallel={param.tensor_model_parallel}, "
                    f"the converter splits it along {dim}"
                )
            continue
        set_tensor_model_parallel_attributes(param, is_parallel=dim is not None, dim=dim or 0, stride=1)
    if arch.pad_token_id is not None:
        model.embedding.word_embeddings.register_forward_hook(_padding_idx_hook(arch.pad_token_id))
    return model.to(device)


def _padding_idx_hook(
    pad_id: int,
) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]:
    """HF's `nn.Embedding(..., padding_idx=pad)`: looking up the pad token gives its row but sends no
    gradient back into it. Megatron's embedding has no padding_idx, so the pad positions' outputs are
    detached instead (same values, same gradients), or a tied model's pad row would train differently."""

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        is_pad = (args[0] == pad_id).unsqueeze(-1)
        return torch.where(is_pad, output.detach(), output)

    return hook


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, S, S] bool, True where attention is masked out (a later position)."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]
