"""The torch trainer: HF causal LMs in plain torch, one instance per data-parallel rank, gradients summed
over a gloo group (every rank holds the whole model).

The duties every trainer shares (the log-prob pass, the train loop with its apply-once guard and snapshot,
dumps, checkpoint bookkeeping) are trainers/core.py's TrainerCore; this file is the plain-torch model, its
gradient sum and clipping, its weights by HF name and its checkpoint format (safetensors in HF names).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from artifacts import content_hashes
from artifacts.atomic import atomic_write_json
from artifacts.checkpoints import model_dir, resolve_checkpoint
from artifacts.hashing import as_dtype, layer_hashes, tensor_hashes, weights_sha256
from artifacts.safetensors_stream import write_safetensors
from trainers import recompute
from trainers.base import Trainer
from trainers.batching import MicroBatch
from trainers.collectives import all_reduce_sum, init_method
from trainers.core import TrainerCore, buckets, copy_as
from trainers.dropout import describe, dropout_keys
from trainers.losses import linear_log_probs_and_entropy
from trainers.settings import TrainerSettings
from trainers.torch_trainer import shared_prompt
from trainers.torch_trainer.shared_prompt import shared_hidden
from trainers.torch_trainer.tied import TiedGrad, tied_embedding


class TorchTrainer(TrainerCore):
    """Implements `trainers.base.Trainer` for HF causal LMs in plain torch (on the CPU)."""

    model: PreTrainedModel
    _dropout = False  # whether the policy or reference model's config turns dropout on (allowed)

    def __init__(self, settings: TrainerSettings, checkpoint: str, rank: int, world_size: int) -> None:
        super().__init__(settings, checkpoint, rank, world_size, torch.device("cpu"))

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, build model, reference model, optimizer and LR schedule."""
        if not dist.is_initialized():
            rendezvous = init_method(master_addr, master_port, Path(self.s.run_dir) / "ft")
            dist.init_process_group(
                "gloo", init_method=rendezvous, rank=self.rank, world_size=self.world_size
            )
        torch.manual_seed(self.s.seed)
        self._start_files = _weight_files(self.checkpoint)
        self.model = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
        self._check_dropout(self.model, self.checkpoint)
        self.model.train()  # train mode matches what the loss sees (dropout too, where allowed)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.ref_model = None
        if self._wants_ref_model():
            ref = model_dir(self.s.ref_load) if self.s.ref_load else self.checkpoint
            self.ref_model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
            self._check_dropout(self.ref_model, ref)
            self.ref_model.train()
            self.ref_model.requires_grad_(False)
        self.params = [p for _, p in self.model.named_parameters()]
        self._recomputed = frozenset(self._set_recompute())
        self._plain_head = has_plain_output_layer(self.model)
        self._tied_embedding = _plainly_tied(self.model)  # its gradient goes through one buffer (tied.py)
        # the shared-prompt forward has no dropout: a model that drops out takes the plain forward in every layout
        self._shared_prompts = self._plain_head and shared_prompt.supports(self.model) and not self._dropout
        self._build_optimizer()
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "params": sum(p.numel() for p in self.params),
        }

    def _check_dropout(self, model: PreTrainedModel, path: str | Path) -> None:
        """Refuse a model whose config turns dropout on unless --allow-model-dropout; ValueError naming the key."""
        found = dropout_keys(model.config.to_dict())
        if found and not self.s.allow_model_dropout:
            raise ValueError(
                f"{path}/config.json: {describe(found)}: RL training runs without dropout (the old-policy "
                "log-probs and the first train step would see different forwards); set it to 0.0, or pass "
                "--allow-model-dropout to train with it"
            )
        self._dropout = self._dropout or bool(found)

    # -- forward -------------------------------------------------------------------------------
    def _response_logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Temperature-scaled logits that predict each response token: [B, T, V] (right padding: no mask
        needed, see MicroBatch)."""
        with self._autocast():
            logits = model(input_ids=mb.input_ids).logits
        idx = mb.response_index[:, :, None].expand(-1, -1, logits.shape[-1])
        return logits.gather(1, idx).float() / self.s.temperature

    def _token_outputs(self, model: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """TrainerCore._token_outputs, one forward per length bucket of `mb` (less padding), or, when its samples
        share prompts and that costs less, each distinct prompt once (shared_prompt.py); only the hidden states
        that predict a response token go through the output layer, chunk by chunk
        (trainers.losses.linear_log_probs_and_entropy: no [B, T_all, V] logits, no [tokens, V] log-softmax).
        Models whose logits are not a plain linear layer over the decoder's output take the generic path."""
        if not self._plain_head:
            return super()._token_outputs(model, mb)
        hf: Any = model  # an HF PreTrainedModel (setup built it)
        head, decoder, embed = hf.get_output_embeddings().weight, hf.base_model, hf.get_input_embeddings()
        tied = (
            TiedGrad() if model is self.model and self._tied_embedding and torch.is_grad_enabled() else None
        )
        lps, ents, targets = [], [], []
        with self._autocast():  # the decoder only: the output layer below takes its own dtype
            if mb.shared is not None and self._shared_prompts:
                selective = self.s.recompute_granularity == "selective"
                hidden = shared_hidden(
                    hf, mb.shared, self._recomputed if model is self.model else frozenset(), selective, tied
                )
                parts = [(hidden, mb.shared.tokens, mb.shared.target)]
            else:
                parts = [
                    (
                        decoder(
                            **_decoder_inputs(embed, mb.input_ids[bucket.rows, : bucket.width], tied),
                            use_cache=False,
                        )
                        .last_hidden_state.flatten(0, 1)
                        .index_select(0, bucket.source),
                        bucket.tokens,
                        bucket.target,
                    )
                    for bucket in mb.buckets
                ]
        # bf16: the output layer's matmul in bfloat16 too, as the engine's; its log-softmax and backward in float32
        head_dtype = torch.bfloat16 if self.s.precision == "bf16" else None
        # --recompute-granularity: the output layer's [tokens, V] log-softmax is recomputed in the backward too
        recompute_head = self.s.recompute_granularity is not None
        for picked, tokens, target in parts:  # picked: [n, H], the hidden states predicting `tokens`
            lp, ent = linear_log_probs_and_entropy(
                picked.float(),
                head,
                tokens,
                temperature=self.s.temperature,
                matmul_dtype=head_dtype,
                recompute=recompute_head,
                weight_grad_sink=None if tied is None else tied.take_dense,
            )
            lps.append(lp)
            ents.append(ent)
            targets.append(target)
        b, t = mb.response_tokens.shape
        target = torch.cat(targets)
        log_probs = torch.zeros(b * t).index_copy(0, target, torch.cat(lps)).view(b, t)
        entropy = torch.cat(ents)
        if not self.s.entropy_coef:  # a metric only: no graph through it
            entropy = entropy.detach()
        return log_probs, torch.zeros(b * t).index_copy(0, target, entropy).view(b, t)

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        """The forward's precision: CPU autocast to bfloat16 under --precision bf16 (matmuls in bfloat16 on the
        float32 master weights, whose gradients stay float32), else nothing. Without autocast's cache: it would
        keep a bfloat16 copy of every weight until the forward ends (the model's size again in bfloat16, also in
        a no-grad log-prob pass and under activation checkpointing); each weight is cast where it is used
        instead, once per forward in these models, to the same values."""
        if self.s.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()

    def _as_engines_hold(self, named: dict[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """The weights as the engines hold them: cast to bfloat16 in a bf16 run, else `named` itself."""
        return as_dtype(named, torch.bfloat16 if self.s.precision == "bf16" else None)

    def _set_recompute(self) -> set[int]:
        """--recompute-*: the policy model's decoder layers recompute their activations in the backward."""
        s = self.s
        if s.recompute_granularity is None:
            return set()
        if not recompute.is_hf_decoder(self.model):
            raise ValueError(
                f"--recompute-granularity: {type(self.model).__name__} has no model.layers to checkpoint; "
                "leave recomputation off for this model"
            )
        return recompute.apply_to_hf(
            self.model, s.recompute_granularity, s.recompute_method, s.recompute_num_layers
        )

    # DP is the whole world: every rank is its own replica, the default group is the DP group
    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return None

    @property
    def replica_lead(self) -> bool:
        return True

    def _sum_grads(self) -> None:
        for p in self.params:
            assert p.grad is not None
            all_reduce_sum(p.grad, deterministic=self.s.deterministic_collective)

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def _state_tensors(self) -> list[torch.Tensor]:
        return list(self.model.state_dict().values())  # buffers too (all of the model's persistent state)

    # -- weights and checkpoints ---------------------------------------------------------------
    def iter_weights(
        self, bucket_bytes: int, dtype: torch.dtype | None = None
    ) -> Iterator[dict[str, torch.Tensor]]:
        """CPU copies of the weights by HF name (the floating ones in `dtype` when given) in buckets of about
        `bucket_bytes`, on rank 0 (every rank holds the same weights, so the others yield nothing)."""
        if self.rank != 0:
            return
        copies = ({k: copy_as(v, dtype)} for k, v in self.model.state_dict().items())
        yield from buckets(copies, bucket_bytes)

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """CPU copies of every persistent weight by HF name, the floating ones in `dtype` when given (cast straight
        from the float32 master weights), on rank 0 ({} elsewhere: the ranks agree)."""
        if self.rank != 0:
            return {}
        return {k: copy_as(v, dtype) for k, v in self.model.state_dict().items()}

    def weights_sha256(self) -> str:
        """Identity of the weights as the engines hold them (export_weights() cast to the engines' dtype: bfloat16
        in a bf16 run), on rank 0 ("" elsewhere): what an engine's own weights_sha256 is compared with."""
        return weights_sha256(self._as_engines_hold(self.model.state_dict())) if self.rank == 0 else ""

    def model_hash(self) -> dict[str, str]:
        """Per-layer SHA-256 of this rank's weights."""
        return layer_hashes(self.model.state_dict())

    def tensor_hashes(self) -> dict[str, str]:
        """Per-tensor SHA-256 of the weights as the engines hold them (artifacts.hashing.tensor_hashes, after the
        cast of weights_sha256), on rank 0 ({} elsewhere)."""
        return tensor_hashes(self._as_engines_hold(self.model.state_dict())) if self.rank == 0 else {}

    def save(self, directory: str, rollout_id: int, *, snapshot: bool = False) -> None:
        """Write iter_{rollout_id:07d}/ (model in HF format, optimizer, scheduler, RNG, the applied rollout's
        metrics); rank 0 only. `snapshot`: a step-boundary snapshot for fault recovery (no hashes, no fault
        hook, only the last two kept)."""
        hashes: list[Any] = [None] * self.world_size
        if self.s.save_model_hash and not snapshot:  # one file per rank, from its own weights
            dist.all_gather_object(hashes, self.model_hash())
        if self.rank != 0:
            return
        tmp = Path(directory) / f"iter_{rollout_id:07d}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # the tensors themselves, not copies (a copy of a 0.5B model's weights and AdamW state is its size again);
        # safetensors refuses two names on one storage, so a tied weight's second name (lm_head) gets a copy
        weights: dict[str, torch.Tensor] = {}
        stored: set[int] = set()
        for k, v in self.model.state_dict().items():
            ptr = v.untyped_storage().data_ptr()
            weights[k] = v.detach().clone() if ptr in stored else v.detach().contiguous()
            stored.add(ptr)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        self.model.config.save_pretrained(str(tmp))
        opt = {}
        names = [n for n, _ in self.model.named_parameters()]
        if self.optimizer is not None:
            for idx, state in self.optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    if value is not None:  # SGD without momentum keeps a None buffer
                        opt[f"{names[idx]}::{key}"] = torch.as_tensor(value)
        # one tensor at a time: moments on disk (--optimizer-offload-dir) leave memory as the next one is read
        reading: Callable[[dict[str, torch.Tensor]], Mapping[str, torch.Tensor]] = (
            self._moments.reading if self._moments is not None else dict
        )
        write_safetensors(tmp / "optimizer.safetensors", reading(opt))
        rng = {"torch_rng": torch.get_rng_state()}
        save_file(rng, str(tmp / "rng.safetensors"))
        if not snapshot:  # what --load and lint-ckpt verify the files' content against
            content_hashes.record(
                tmp,
                {"model.safetensors": weights, "optimizer.safetensors": reading(opt), "rng.safetensors": rng},
            )
        sched = self.scheduler.state_dict() if self.scheduler is not None else {}
        atomic_write_json(tmp / "scheduler.json", {k: v for k, v in sched.items() if k != "lr_lambdas"})
        for rank, layer_hash in enumerate(hashes):
            if layer_hash is not None:
                atomic_write_json(tmp / f"model_hash_tp0_pp0_dp{rank}_cp0.json", layer_hash)
        atomic_write_json(tmp / "meta.json", self._checkpoint_meta(rollout_id))
        self._publish_checkpoint(tmp, directory, rollout_id, snapshot=snapshot)
        self._offload_moments()  # writing them brought their pages back

    restores_boundary_alone = True  # each rank reads the files rank 0 wrote, with no collective

    def _reload_start(self) -> None:
        """The policy's weights read again from the checkpoint setup loaded, which must be unchanged since (its
        weight files' names, sizes and modification times)."""
        if _weight_files(self.checkpoint) != self._start_files:
            raise RuntimeError(
                f"restoring a failed first step: the weight files of {self.checkpoint} changed since the trainer "
                "loaded them, so its start weights cannot be read back; start the run again"
            )
        start = AutoModelForCausalLM.from_pretrained(self.checkpoint, dtype=torch.float32)
        self.model.load_state_dict(start.state_dict())

    def load(self, directory: str) -> int:
        """Restore the latest (or the given iter_ dir's) checkpoint; returns its rollout id."""
        return self._load(resolve_checkpoint(directory), check_model_hash=self.s.check_model_hash)

    def _restore_boundary(self, directory: str | None, rollout_id: int) -> None:
        assert directory is not None
        path = resolve_checkpoint(directory)
        if self._load(path, check_model_hash=False) != rollout_id:  # a snapshot writes no model hashes
            raise RuntimeError(
                f"restoring a failed step: the step-boundary snapshot {path} is not of rollout {rollout_id}"
            )
        for p in self.params:
            p.grad = None

    def _load(self, path: Path, *, check_model_hash: bool) -> int:
        """`load` of the checkpoint dir `path` (an iter_ dir)."""
        self.model.load_state_dict(self._read_verified(path, "model.safetensors"))
        if check_model_hash:
            own = f"model_hash_tp0_pp0_dp{self.rank}_cp0.json"
            self._check_model_hash(path, own, fallback="model_hash_tp0_pp0_dp0_cp0.json")
        opt = self._read_verified(path, "optimizer.safetensors")
        if opt and self.optimizer is not None:
            names = [n for n, _ in self.model.named_parameters()]
            state: dict[int, dict[str, torch.Tensor]] = defaultdict(dict)
            for key, value in opt.items():
                name, _, field = key.partition("::")
                state[names.index(name)][field] = value
            self._check_optimizer_fields(path, {f for fields in state.values() for f in fields})
            self._set_optimizer_state(dict(state))
        self._set_scheduler_state(json.loads((path / "scheduler.json").read_text()))
        torch.set_rng_state(self._read_verified(path, "rng.safetensors")["torch_rng"])
        return self._restore_meta(path)

    def _read_verified(self, path: Path, file: str) -> dict[str, torch.Tensor]:
        """The tensors of `path`/`file`, checked against the content hashes its save recorded (unless
        --no-verify-checkpoint); a tensor that differs is a ValueError naming the file and the tensor."""
        tensors = load_file(str(path / file))
        if self.s.verify_checkpoint and (problem := content_hashes.verify_loaded(path, file, tensors)):
            raise ValueError(f"--load {path}: {problem} ({content_hashes.CHANGED})")
        return tensors


def _decoder_inputs(
    embed: torch.nn.Embedding, ids: torch.Tensor, tied: TiedGrad | None
) -> dict[str, torch.Tensor]:
    """The decoder's keyword inputs for `ids` [B, T]: the ids themselves, or with `tied` their embeddings looked up
    through it (the decoder's own lookup would give the embedding a dense gradient of its own)."""
    if tied is None:
        return {"input_ids": ids}
    return {"inputs_embeds": tied_embedding(ids, embed.weight, embed.padding_idx, tied)}


def _plainly_tied(model: PreTrainedModel) -> bool:
    """Whether `model`'s input embedding is a plain nn.Embedding (no scaling of its own) holding the output
    layer's weight."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    return type(embed) is torch.nn.Embedding and head is not None and head.weight is embed.weight


@torch.no_grad()
def has_plain_output_layer(model: PreTrainedModel) -> bool:
    """Whether `model`'s logits are exactly output_layer(base_model(ids).last_hidden_state) with a bias-free
    linear output layer, so the trainer may apply that layer to the response positions only. Probed, not
    assumed from the class: a family that rescales or soft-caps its logits (Gemma, Cohere, ...) fails the
    bitwise comparison and keeps the full forward."""
    head = model.get_output_embeddings()
    decoder = getattr(model, "base_model", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or decoder is None or decoder is model:
        return False
    ids = torch.arange(min(8, head.out_features))[None]
    training = model.training
    model.eval()  # the structure is probed, not the dropout (which would make two forwards differ)
    try:
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
        return bool(torch.equal(head(hidden), model(input_ids=ids, use_cache=False).logits))
    finally:
        model.train(training)


# mypy checks here that TorchTrainer (constructor included) satisfies the Trainer protocol
_CHECKED: type[Trainer] = TorchTrainer


def _weight_files(checkpoint: str) -> dict[str, tuple[int, int]]:
    """{file name: (size, modification time in ns)} of a checkpoint directory's weight files."""
    files = [f for f in Path(checkpoint).iterdir() if f.suffix in (".safetensors", ".bin")]
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(files)}
