"""Embedded torch inference engine.

Batched sampling with a KV cache over any HF causal LM. Each request draws its token at every step by inversion
of its own distribution with a uniform that is a pure function of (its seed, the step) (`sample_by_inversion`), so
a request's tokens depend only on its seed, its prompt and the weights, never on which other requests share the
batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from artifacts.hashing import tensor_hashes, weights_sha256
from engines.base import Engine, EngineReleased, GenerateOutput, GenerateRequest
from engines.torch_engine.decoder import (
    Decoder,
    FastDecoder,
    FastWeights,
    HFDecoder,
    prepacked_linear_supported,
)
from procs import trim_heap


class TorchEngine:
    """Implements `engines.base.Engine` with a plain torch forward pass."""

    # a request's tokens do not depend on the batch it is in (per-request seeded sampling) in float32; bfloat16
    # matmul kernels may round a row differently with the batch's size (oneDNN's do below AVX512-BF16)
    layout_invariant = True

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        num_threads: int = 1,
        precision: str = "fp32",
        max_batch_size: int = 256,
        device: str = "cpu",
    ) -> None:
        torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        if precision not in ("bf16", "fp32"):
            raise ValueError(
                f"engine precision {precision!r}: expected bf16 or fp32 (auto is resolved before)"
            )
        # bf16: weights, activations and KV cache in bfloat16; the decoders return float32 logits, so the
        # log-softmax, the sampling and the recorded log-probs stay float32
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.layout_invariant = precision == "fp32"
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=self.dtype)
        self._model = model.to(self.device)  # type: ignore[arg-type]
        self._model.eval()
        self.pad_id = int(self._model.config.pad_token_id or 0)
        self.max_batch_size = max_batch_size
        self._version = 0
        self._sha256: str | None = None  # of the weights now held; None = not computed since the last change
        # the same, per tensor (asked for only on a mismatch)
        self._tensor_hashes: dict[str, str] | None = None
        self._fast: FastWeights | None = None  # FastDecoder's view of the weights; None = rebuild before use
        # bf16 on a CPU with AVX512-BF16 / AMX: the fast decoder holds the layer matrices prepacked for oneDNN
        self._prepack = prepacked_linear_supported(self.dtype, self.device)
        self._names = list(self._model.state_dict())  # every persistent weight, as a sync names them
        # each parameter's shape and dtype (a tied weight once), whether its storage is held, released or prepacked
        self._shapes = {name: (p.shape, p.dtype) for name, p in self._model.named_parameters()}
        # every parameter's storage dropped (release_memory), not yet allocated again
        self._memory_released = False
        self._unloaded: set[str] = set()  # weights not loaded since the memory was released

    # -- generation ----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, requests: list[GenerateRequest]) -> list[GenerateOutput]:
        """Complete every request; outputs are in request order. EngineReleased while the weights are released."""
        self._require_weights("generate")
        outputs: list[GenerateOutput] = []
        for start in range(0, len(requests), self.max_batch_size):
            outputs.extend(self._generate_batch(requests[start : start + self.max_batch_size]))
        return outputs

    def _decoder(self, length: int) -> Decoder:
        """A decoder for one batch; the fast one's rearranged weights are rebuilt after a weight change."""
        if not FastDecoder.supports(self._model):
            return HFDecoder(self._model)
        if self._fast is None or self._fast.cos.shape[0] < length:
            self._plain()
            positions = max(length, self._model.config.max_position_embeddings)
            self._fast = FastWeights(self._model, positions, prepack=self._prepack)
        return FastDecoder(self._fast, length)

    def _plain(self) -> dict[str, torch.Tensor]:
        """The model's weights (its state_dict), first put back into its parameters if the fast decoder holds them
        prepacked; every read or write of the weights goes through here."""
        if self._fast is not None and self._fast.prepacked:
            self._fast.unpack()
            self._fast = None
        return self._model.state_dict()

    @property
    def model(self) -> torch.nn.Module:
        """The HF model with its weights in place (put back from the prepacked layout first): for callers outside
        the engine, such as a test that runs the model's own forward."""
        self._plain()
        return self._model

    def _generate_batch(self, reqs: list[GenerateRequest]) -> list[GenerateOutput]:
        b, width = len(reqs), max(len(r.prompt_tokens) for r in reqs)
        steps = max(r.params.max_new_tokens for r in reqs)
        # left padding keeps every row's last prompt token at the end; built as lists, one tensor each
        ids = torch.tensor(
            [[self.pad_id] * (width - len(r.prompt_tokens)) + list(r.prompt_tokens) for r in reqs],
            dtype=torch.long,
            device=self.device,
        )
        key_mask = torch.tensor(
            [
                [False] * (width - len(r.prompt_tokens)) + [True] * (len(r.prompt_tokens) + steps)
                for r in reqs
            ],
            dtype=torch.bool,
            device=self.device,
        )
        positions = (key_mask[:, :width].long().cumsum(-1) - 1).clamp(min=0)
        # per live row (these shrink as rows finish and are dropped from the batch)
        rows = torch.arange(b, device=self.device)  # each live row's index in `reqs`
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=self.device)
        seeds = torch.tensor([r.seed for r in reqs], dtype=torch.long, device=self.device)
        max_new = torch.tensor([r.params.max_new_tokens for r in reqs], device=self.device)
        n_stop = max(1, max(len(r.params.stop_token_ids) for r in reqs))
        stops = torch.tensor(
            [list(r.params.stop_token_ids) + [-1] * (n_stop - len(r.params.stop_token_ids)) for r in reqs],
            dtype=torch.long,
            device=self.device,
        )
        live = torch.ones(b, dtype=torch.bool, device=self.device)
        filters = _row_filters(reqs)
        # per request
        tokens = torch.full((b, steps), self.pad_id, dtype=torch.long, device=self.device)
        logps = torch.zeros((b, steps), dtype=torch.float32, device=self.device)
        lengths = torch.zeros(b, dtype=torch.long, device=self.device)
        stopped = torch.zeros(b, dtype=torch.bool, device=self.device)

        decoder = self._decoder(width + steps)
        # a GRPO group repeats its prompt n_samples_per_prompt times: run each distinct prompt once, then
        # give every row a copy of its prompt's cache
        first = {prompt: i for i, prompt in reversed(list(enumerate(r.prompt_tokens for r in reqs)))}
        if len(first) < b:
            unique = torch.tensor(sorted(first.values()), device=self.device)
            slot = {i: n for n, i in enumerate(unique.tolist())}
            expand = torch.tensor([slot[first[r.prompt_tokens]] for r in reqs], device=self.device)
            logits = decoder.prefill(ids[unique], positions[unique], key_mask[unique])
            decoder.keep(expand)
            logits = logits[expand]
        else:
            logits = decoder.prefill(ids, positions, key_mask)
        next_pos = positions[:, -1] + 1
        scaled = any(r.params.temperature != 1.0 for r in reqs)  # x / 1.0 is x: no pass for it
        # the step's float32 [rows, V] log-probs, in one buffer for every step (why: FastDecoder._forward's logits)
        logp_buf = torch.empty(logits.shape, dtype=torch.float32, device=self.device)
        for step in range(steps):
            if scaled:
                logits.div_(temps[:, None])  # the decoders' own float32 logits, in place
            logp = torch._log_softmax(logits, -1, False, out=logp_buf[: logits.shape[0]])
            # the logits are not read again this step: their buffer takes the sampler's running sum
            filtered = _filter_top_k_top_p(logp, filters, rows)
            picked = sample_by_inversion(filtered, seeds, step, out=logits)
            at = rows[live]
            tokens[at, step] = picked[live]
            logps[at, step] = logp.gather(-1, picked[:, None]).squeeze(-1)[live]
            hit_stop = (picked[:, None] == stops).any(-1) & live
            stopped[rows[hit_stop]] = True
            finished = (hit_stop | (max_new <= step + 1)) & live
            lengths[rows[finished]] = step + 1
            live &= ~finished
            n_live = int(live.sum())
            if n_live == 0:
                break
            # a finished row still costs a full row per step until it is dropped, and dropping copies the
            # cache: drop once a quarter of the batch is finished
            if (live.numel() - n_live) * 4 >= live.numel():
                keep = live.nonzero().squeeze(1)
                decoder.keep(keep)
                rows, temps, seeds, max_new, stops, picked, next_pos = (
                    t.index_select(0, keep) for t in (rows, temps, seeds, max_new, stops, picked, next_pos)
                )
                live = live[keep]
            logits = decoder.decode(picked, next_pos)
            next_pos = next_pos + 1
        tok_rows, lp_rows, lens = tokens.tolist(), logps.tolist(), lengths.tolist()
        return [
            GenerateOutput(
                response_tokens=tuple(tok_rows[i][: lens[i]]),
                log_probs=tuple(lp_rows[i][: lens[i]]),
                finish_reason="stop" if bool(stopped[i]) else "length",
                weight_version=self._version,
            )
            for i in range(b)
        ]

    # -- weights -------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        """Copy every named tensor in place and hold `version`; unknown or missing names are an error."""
        missing = sorted(set(self._names) - set(named_tensors))
        if missing:
            raise KeyError(f"weight update does not match the engine's model: missing={missing[:5]}")
        self.load_weights(named_tensors)
        self.set_weight_version(version)

    @torch.no_grad()
    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        """Copy these tensors in place (a bucket of a streamed sync), cast to the engine's dtype (a float32
        trainer's weights become bfloat16 in a bf16 engine); unknown names are an error."""
        self.resume_memory()  # a load is what released memory is taken back for
        params = self._plain()
        unknown = sorted(set(named_tensors) - set(params))
        if unknown:
            raise KeyError(f"weight update does not match the engine's model: unknown={unknown[:5]}")
        for name, tensor in named_tensors.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        self._unloaded.difference_update(named_tensors)
        self._sha256, self._tensor_hashes, self._fast = None, None, None

    def set_weight_version(self, version: int) -> None:
        """Record the version of the weights now held (after the last bucket of a sync)."""
        self._version = version

    def weight_names(self) -> list[str]:
        """Names of every persistent weight (what a complete sync must deliver)."""
        return list(self._names)

    def get_weights(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Copies of the named persistent weights (all when `names` is None); EngineReleased for a weight not
        loaded back since a release."""
        self._require_weights("read weights", names)
        state = self._plain()
        return {n: state[n].detach().clone().cpu() for n in (names or list(state))}

    @torch.no_grad()
    def snapshot_and_scramble(self, seed: int = 0) -> int:
        """Keep a copy of every persistent weight, then overwrite each with noise (the weight-update
        check: only a complete, correct sync can restore them). Returns the number of tensors."""
        self.resume_memory()
        state = self._plain()
        self._sha256, self._tensor_hashes, self._fast = None, None, None
        gen = torch.Generator().manual_seed(seed)
        for t in state.values():
            t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))
        return len(state)

    def weight_version(self) -> int:
        """Version of the weights now held."""
        return self._version

    def weights_sha256(self) -> str:
        """Identity of the weights now held (artifacts.hashing.weights_sha256); computed once per change
        of weights (they change only through update_weights and snapshot_and_scramble). A released engine answers
        the identity of the weights it released."""
        if self._sha256 is None:
            self._require_weights("hash its weights")
            self._sha256 = weights_sha256(self._plain())
        return self._sha256

    def tensor_hashes(self) -> dict[str, str]:
        """{name: sha256} of every persistent weight now held (artifacts.hashing.tensor_hashes), so a
        weights_sha256 mismatch can name the tensors; cached until the weights change, like weights_sha256."""
        if self._tensor_hashes is None:
            self._require_weights("hash its weights")
            self._tensor_hashes = tensor_hashes(self._plain())
        return self._tensor_hashes

    def release_memory(self) -> None:
        """Drop the weights (every parameter's storage) and what is built from them (the fast decoder's fused
        copies; the KV cache lives only within a generate call), and give the freed pages back. The engine then
        refuses to generate or hand out weights until every weight is loaded again (resume_memory, then a full
        sync). Its weights' identity (weights_sha256) is kept: the sync compares with it."""
        if self._memory_released:
            return
        self.weights_sha256()  # cached after a check; the identity outlives the storage
        self._memory_released = True
        for p in self._model.parameters():  # a tied weight is one parameter
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._unloaded, self._tensor_hashes, self._fast = set(self._names), None, None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        trim_heap()

    def resume_memory(self) -> None:
        """Allocate the released weights' storage again (uninitialized: the sync that follows fills it); a no-op
        while the memory is held."""
        if not self._memory_released:
            return
        params = dict(self._model.named_parameters())
        for name, (shape, dtype) in self._shapes.items():
            params[name].data = torch.empty(shape, dtype=dtype, device=self.device)
        self._memory_released = False

    @property
    def released(self) -> bool:
        """Whether some weight is not loaded since the last release_memory."""
        return bool(self._unloaded)

    def _require_weights(self, what: str, names: list[str] | None = None) -> None:
        """EngineReleased when the weights `what` needs (`names`, or all) were released and not loaded back."""
        missing = self._unloaded if names is None else self._unloaded.intersection(names)
        if missing:
            raise EngineReleased(
                f"the engine was asked to {what} but its weights are released (--offload-rollout): "
                f"{len(self._unloaded)} of {len(self._names)} weights not loaded back since, e.g. "
                f"{sorted(missing)[:3]}; a weight sync (resume_memory, then every weight) loads them"
            )

    def health(self) -> dict[str, Any]:
        """Status of this engine."""
        return {
            "backend": "torch",
            "device": str(self.device),
            "weight_version": self._version,
            "threads": torch.get_num_threads(),
            "released": self.released,
            "dtype": str(self.dtype).removeprefix("torch."),
            "linear": "onednn-prepacked" if self._prepack else "torch",
        }

    def shutdown(self) -> None:
        """Drop the model."""
        del self._model


def _signed(x: int) -> int:
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _splitmix64_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function of `z` (int64 holding uint64 bits), in place."""
    z += _GOLDEN
    for shift, mul in ((30, _MIX1), (27, _MIX2), (31, None)):
        t = z >> shift
        t &= (1 << (64 - shift)) - 1  # a logical shift: torch's >> is arithmetic
        z ^= t
        if mul is not None:
            z *= mul
    return z


def counter_uniform(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One uniform in (0, 1] per row, [B] float32, a pure function of (seed, step): the top 24 bits of splitmix64
    over the counter splitmix64(seed) + step x golden ratio (the top value, (2^24 - 0.5) / 2^24, rounds to 1.0).
    A counter-based generator instead of one torch.Generator per request: the same bits per request whatever the
    batch, computed for the whole batch at once."""
    counter = _splitmix64_(seeds.clone()) + _signed(step * _GOLDEN % (1 << 64))
    bits = _splitmix64_(counter)
    bits >>= 40
    bits &= (1 << 24) - 1  # the top 24 bits: exact in float32
    return (bits.to(torch.float32) + 0.5) / float(1 << 24)


def sample_by_inversion(
    logp: torch.Tensor, seeds: torch.Tensor, step: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A token per row drawn from exp(logp), [B, V] -> [B] long (-inf = excluded, as top-k / top-p leave it): the
    first index whose running sum of probabilities exceeds u x the row's total, u = counter_uniform(seeds, step).
    `out`: a float32 [B, V] tensor other than `logp` that the running sum is written into (None = a new one).

    Each row is drawn from its own values and its own u alone, so its token does not depend on the batch. Three
    passes over [B, V] (exp, running sum, search): Gumbel-max would hash a noise value for every entry. A token
    of zero probability is never drawn, also where u x total rounds up to the total. A row holding a NaN draws its
    first NaN, so that the recorded log-prob shows it."""
    cdf = torch.exp(logp, out=out).cumsum_(dim=-1)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, counter_uniform(seeds, step)[:, None] * total, right=True)
    # the first index reaching the total is the last token with a probability
    picked = torch.minimum(picked, torch.searchsorted(cdf, total)).squeeze(1)
    broken = total.squeeze(1).isnan()  # a NaN anywhere in a row runs through the rest of its sum
    if bool(broken.any()):
        picked[broken] = logp[broken].isnan().int().argmax(dim=-1)
    return picked


def _row_filters(reqs: list[GenerateRequest]) -> list[tuple[int, float]] | None:
    """(top_k, top_p) per request; None when no request truncates its distribution."""
    if all(r.params.top_k <= 0 and r.params.top_p >= 1.0 for r in reqs):
        return None
    return [(r.params.top_k, r.params.top_p) for r in reqs]


def _filter_top_k_top_p(
    logp: torch.Tensor, filters: list[tuple[int, float]] | None, rows: torch.Tensor
) -> torch.Tensor:
    """Set log-probs outside each row's top-k / top-p set to -inf. logp: [B, V]; rows: [B], each row's
    index into `filters`."""
    if filters is None:
        return logp
    out = logp.clone()
    for i, req_index in enumerate(rows.tolist()):
        top_k, top_p = filters[req_index]
        row = out[i]
        if top_k > 0:
            kth = torch.topk(row, min(top_k, row.numel())).values[-1]
            row[row < kth] = float("-inf")
        if top_p < 1.0:
            sorted_lp, order = torch.sort(row, descending=True)
            cum = torch.cumsum(sorted_lp.exp(), dim=-1)
            drop = cum - sorted_lp.exp() > top_p  # keep the smallest set reaching top_p
            row[order[drop]] = float("-inf")
    return out


# mypy checks here that TorchEngine (constructor included) satisfies the Engine protocol
_CHECKED: type[Engine] = TorchEngine
