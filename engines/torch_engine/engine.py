"""Embedded torch inference engine.

Batched sampling with a KV cache over any HF causal LM. Sampling uses the Gumbel-max trick with
one `torch.Generator` per request, seeded from the request: every row draws its own noise at every
step, so a request's tokens depend only on its seed, its prompt and the weights, never on which
other requests share the batch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from artifacts.hashing import weights_sha256
from engines.base import GenerateOutput, GenerateRequest


class TorchEngine:
    """Implements `engines.base.Engine` with a plain torch forward pass."""

    def __init__(self, checkpoint: str | Path, *, num_threads: int = 1, max_batch_size: int = 256,
                 device: str = "cpu") -> None:
        torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).to(self.device)  # type: ignore[arg-type]
        self.model.eval()
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.max_batch_size = max_batch_size
        self._version = 0

    # -- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """Complete every request; outputs are in request order."""
        outputs: list[GenerateOutput] = []
        for start in range(0, len(requests), self.max_batch_size):
            outputs.extend(self._generate_batch(requests[start:start + self.max_batch_size]))
        return outputs

    def _generate_batch(self, reqs: list[GenerateRequest]) -> list[GenerateOutput]:
        b, width = len(reqs), max(len(r.prompt_tokens) for r in reqs)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, r in enumerate(reqs):  # left padding keeps every row's last prompt token at the end
            ids[i, width - len(r.prompt_tokens):] = torch.tensor(r.prompt_tokens)
            mask[i, width - len(r.prompt_tokens):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=self.device)
        gens = [torch.Generator().manual_seed(r.seed) for r in reqs]
        max_new = [r.params.max_new_tokens for r in reqs]
        stops = [set(r.params.stop_token_ids) for r in reqs]

        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         cache=cache, use_cache=True)
        logits = out.logits[:, -1, :]
        next_pos = positions[:, -1:] + 1
        tokens: list[list[int]] = [[] for _ in reqs]
        logps: list[list[float]] = [[] for _ in reqs]
        done = [False] * b
        for _ in range(max(max_new)):
            logp = torch.log_softmax(logits.float() / temps[:, None], dim=-1)
            filtered = _filter_top_k_top_p(logp, reqs)
            noise = torch.stack([torch.rand(logp.shape[-1], generator=g) for g in gens]).to(self.device)
            gumbel = -torch.log(-torch.log(noise.clamp(min=1e-20, max=1.0 - 1e-7)))
            picked = torch.argmax(filtered + gumbel, dim=-1)
            picked_logp = logp.gather(-1, picked[:, None]).squeeze(-1)
            for i in range(b):
                if done[i]:
                    continue
                tok = int(picked[i])
                tokens[i].append(tok)
                logps[i].append(float(picked_logp[i]))
                done[i] = tok in stops[i] or len(tokens[i]) >= max_new[i]
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=self.device)], dim=-1)
            out = self.model(input_ids=picked[:, None], attention_mask=mask, position_ids=next_pos,
                             cache=cache, use_cache=True)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        return [
            GenerateOutput(
                response_tokens=tuple(tokens[i]),
                log_probs=tuple(logps[i]),
                finish_reason="stop" if tokens[i] and tokens[i][-1] in stops[i] else "length",
                weight_version=self._version,
            )
            for i in range(b)
        ]

    # -- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        """Copy every named tensor in place; unknown or missing names are an error."""
        params = dict(self.model.state_dict())
        missing = sorted(set(params) - set(named_tensors))
        unknown = sorted(set(named_tensors) - set(params))
        if missing or unknown:
            raise KeyError(f"weight update does not match the engine's model: missing={missing[:5]} "
                           f"unknown={unknown[:5]}")
        for name, tensor in named_tensors.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        self._version = version

    def get_weights(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Copies of the named persistent weights (all when `names` is None)."""
        state = self.model.state_dict()
        return {n: state[n].detach().clone().cpu() for n in (names or list(state))}

    def weight_version(self) -> int:
        """Version of the weights now held."""
        return self._version

    def weights_sha256(self) -> str:
        """Identity of the weights now held (artifacts.hashing.weights_sha256)."""
        return weights_sha256(self.model.state_dict())

    def release_memory(self) -> None:
        """Free accelerator memory (empties the CUDA cache; nothing to do on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume_memory(self) -> None:
        """Counterpart of `release_memory` (weights stay resident in this engine)."""

    def health(self) -> dict:
        """Status of this engine."""
        return {"backend": "torch", "device": str(self.device), "weight_version": self._version,
                "threads": torch.get_num_threads()}

    def shutdown(self) -> None:
        """Drop the model."""
        del self.model


def _filter_top_k_top_p(logp: torch.Tensor, reqs: list[GenerateRequest]) -> torch.Tensor:
    """Set log-probs outside each row's top-k / top-p set to -inf. logp: [B, V]."""
    if all(r.params.top_k <= 0 and r.params.top_p >= 1.0 for r in reqs):
        return logp
    out = logp.clone()
    for i, r in enumerate(reqs):
        row = out[i]
        if r.params.top_k > 0:
            kth = torch.topk(row, min(r.params.top_k, row.numel())).values[-1]
            row[row < kth] = float("-inf")
        if r.params.top_p < 1.0:
            sorted_lp, order = torch.sort(row, descending=True)
            cum = torch.cumsum(sorted_lp.exp(), dim=-1)
            drop = cum - sorted_lp.exp() > r.params.top_p  # keep the smallest set reaching top_p
            row[order[drop]] = float("-inf")
    return out
