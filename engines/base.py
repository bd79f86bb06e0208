"""The engine interface: token ids in, token ids and per-token log-probs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class StaleWeights(RuntimeError):
    """An actor refused work on weights of another version than the call names (an engine asked to generate on a
    version it does not hold, the rollout actor handed outputs of another version): nothing was generated or
    written."""


class EngineReleased(RuntimeError):
    """An engine was asked for work that needs its weights while they are released (--offload-rollout) and not yet
    loaded back by a weight sync: nothing was done."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters (slime/SGLang names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 8
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerateRequest:
    """One prompt to complete. `seed` fixes the sampling noise: same seed + weights => same tokens."""

    prompt_tokens: tuple[int, ...]
    seed: int
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class GenerateOutput:
    """One completion. `log_probs[i]` is log p(response_tokens[i]) under the temperature-scaled
    distribution (before top-p/top-k truncation), as the trainer recomputes it.
    `finish_reason` is "stop" (a stop token was produced, and is included) or "length"."""

    response_tokens: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str
    weight_version: int


@dataclass(frozen=True)
class EngineAnswer:
    """What an engine actor answers a `generate` call: the outputs, in request order, and the seconds the engine
    spent on them (timed in the engine, so time a call waits in the actor's queue is not charged)."""

    outputs: list[GenerateOutput]
    seconds: float


class Engine(Protocol):
    """What every inference backend provides. One instance lives in one Ray actor; it is built from an HF
    checkpoint dir (model + tokenizer) with the torch thread count of the run and its resolved precision (bf16:
    bfloat16 weights and KV cache, float32 logits and log-probs; fp32: float32 throughout)."""

    def __init__(self, checkpoint: str, *, num_threads: int = 1, precision: str = "fp32") -> None: ...

    def generate(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """Complete every request (batched); outputs are in request order."""
        ...

    def update_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        """Replace the model weights (all of them, by name) and record the weight version."""
        ...

    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        """Copy some of the weights in place (a bucket of a streamed sync); the version is unchanged."""
        ...

    def set_weight_version(self, version: int) -> None:
        """Record the version of the weights now held (after the last bucket of a sync)."""
        ...

    def weight_names(self) -> list[str]:
        """Names of every persistent weight: what a complete sync delivers."""
        ...

    def get_weights(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Copies of the named weights (all persistent ones when `names` is None)."""
        ...

    def weight_version(self) -> int:
        """Version of the weights now held (the rollout id whose training produced them)."""
        ...

    def snapshot_and_scramble(self, seed: int = 0) -> int:
        """Overwrite every persistent weight with noise (before a checked sync); returns how many."""
        ...

    def weights_sha256(self) -> str:
        """Identity of the weights now held (artifacts.hashing.weights_sha256)."""
        ...

    def tensor_hashes(self) -> dict[str, str]:
        """{name: sha256} of every persistent weight now held (artifacts.hashing.tensor_hashes)."""
        ...

    def release_memory(self) -> None:
        """Drop the weights and KV cache while the trainers work (--offload-rollout); until a full weight load
        brings them back, work that needs them raises EngineReleased. The weights' identity (weights_sha256) is
        kept."""
        ...

    def resume_memory(self) -> None:
        """Take the memory back after `release_memory`, for the weight load that follows."""
        ...

    def health(self) -> dict[str, Any]:
        """A small status dict; raises if the engine cannot serve."""
        ...

    def shutdown(self) -> None:
        """Release everything; the engine is unusable afterwards."""
        ...
