"""Settings of an SGLang engine (slime's `--sglang-*` flags: SGLang's own server arguments with a prefix).

They are kept in the run's config for an SGLang engine backend; the embedded torch engine has no such settings and
ignores them, which the run says once at start-up (config/slime_compat.py). The flags slime's scripts use most are
typed fields; any other `--sglang-NAME [VALUE]` is kept as text in `sglang_server_args` (SGLang checks it)."""

from __future__ import annotations

from pydantic import Field, field_validator

from config.base import Section

PREFIX = "sglang_"


class SGLangConfig(Section):
    """SGLang server arguments (slime's --sglang-* flags), for an SGLang engine backend."""

    sglang_mem_fraction_static: float | None = Field(
        None, gt=0.0, le=1.0, description="Share of GPU memory SGLang keeps for weights and KV cache."
    )
    sglang_enable_deterministic_inference: bool = Field(
        False, description="SGLang's batch-invariant kernels (the same tokens whatever the batch)."
    )
    sglang_attention_backend: str | None = Field(
        None, description="SGLang's attention kernel (flashinfer, fa3, triton, ...)."
    )
    sglang_server_concurrency: int | None = Field(
        None, ge=1, description="Requests slime keeps in flight per SGLang server (slime's default 512)."
    )
    sglang_cuda_graph_max_bs: int | None = Field(
        None, ge=1, description="Largest batch SGLang captures a CUDA graph for."
    )
    sglang_max_running_requests: int | None = Field(
        None, ge=1, description="SGLang's cap on running requests."
    )
    sglang_chunked_prefill_size: int | None = Field(None, description="SGLang's prefill chunk in tokens.")
    sglang_context_length: int | None = Field(None, ge=1, description="SGLang's context length override.")
    sglang_disable_radix_cache: bool = Field(False, description="Turn SGLang's prefix cache off.")
    sglang_enable_dp_attention: bool = Field(False, description="SGLang's data-parallel attention.")
    sglang_dp_size: int | None = Field(
        None, ge=1, description="SGLang's data-parallel size inside one engine."
    )
    sglang_ep_size: int | None = Field(None, ge=1, description="SGLang's expert-parallel size.")
    sglang_log_level: str | None = Field(None, description="SGLang's log level.")
    sglang_server_args: dict[str, str | bool] = Field(
        default_factory=dict,
        description="Any other --sglang-NAME VALUE (or a bare --sglang-NAME switch) of the launch line, by NAME "
        "without the prefix, as text for SGLang to check; a JSON object here.",
    )

    @field_validator("sglang_server_args")
    @classmethod
    def _names(cls, value: dict[str, str | bool]) -> dict[str, str | bool]:
        bad = [k for k in value if not k or not k.replace("_", "").replace("-", "").isalnum()]
        if bad:
            raise ValueError(f"SGLang argument names are letters, digits, '-' and '_': {bad}")
        return value

    def given(self) -> list[str]:
        """The --sglang-* flags this config holds (set away from their defaults), as flags."""
        flags = [
            "--" + name.replace("_", "-")
            for name in type(self).model_fields
            if name != "sglang_server_args" and getattr(self, name) not in (None, False)
        ]
        flags += ["--sglang-" + k.replace("_", "-") for k in self.sglang_server_args]
        return flags
