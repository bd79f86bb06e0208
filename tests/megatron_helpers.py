"""Builders shared by the Megatron backend's tests: tiny HF models, a synthetic rollout, a run config, and
the per-rank worker that `torch.multiprocessing.spawn` runs for tensor/data-parallel comparisons."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path
from typing import Any

import torch

from artifacts.schema import Sample
from artifacts.store import ArtifactRef, read_table, write_rollout
from config import RunConfig
from trainers.settings import trainer_settings

PAD = 0


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_hf_model(
    path: Path,
    *,
    family: str = "qwen2",
    tied: bool = True,
    vocab: int = 31,
    heads: int = 4,
    kv_heads: int = 2,
    hidden: int = 32,
    ffn: int = 48,
    layers: int = 2,
    seed: int = 0,
) -> Path:
    """save_pretrained of a small random Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm per head, head_dim twice
    hidden / heads as Qwen3-4B's 128 is not 2560 / 32) or Llama (no bias) into `path`; GQA by default.
    Biases and norm weights are randomised too, so a conversion that drops or misplaces them shows."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        pad_token_id=PAD,
        eos_token_id=1,
        bos_token_id=1,
        rms_norm_eps=1e-6,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: torch.nn.Module
        if family == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))  # type: ignore[arg-type]
        elif family == "qwen3":
            config = Qwen3Config(**common, head_dim=2 * hidden // heads)  # type: ignore[arg-type]
            model = Qwen3ForCausalLM(config)
        else:  # a non-default RoPE theta, so a conversion that ignores it shows
            rope = {"rope_type": "default", "rope_theta": 5000.0}
            model = LlamaForCausalLM(LlamaConfig(**common, rope_parameters=rope))  # type: ignore[arg-type]
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(path, safe_serialization=True)
    return path


def synthetic_rollout(
    path: Path,
    *,
    vocab: int = 31,
    groups: int = 2,
    per_group: int = 4,
    seed: int = 0,
    rollout_id: int = 0,
    prompt_len: tuple[int, int] = (3, 7),
    response_len: tuple[int, int] = (1, 5),
) -> tuple[list[Sample], ArtifactRef]:
    """A rollout with ragged prompts/responses (lengths drawn from the inclusive ranges), some masked-out
    response tokens, the pad token inside a prompt (HF's padding_idx semantics), varied rewards and
    engine log-probs."""
    rng = random.Random(seed)
    samples = []
    for i in range(groups * per_group):
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(*prompt_len))]
        if i % 3 == 0:
            prompt[1] = PAD
        n = rng.randint(*response_len)
        response = [rng.randrange(1, vocab) for _ in range(n)]
        mask = [1] * n
        if n > 2:
            mask[rng.randrange(n)] = 0
        samples.append(
            Sample(
                rollout_id=rollout_id,
                group_index=i // per_group,
                sample_index=i,
                prompt="p",
                prompt_tokens=prompt,
                response="r",
                response_tokens=response,
                response_length=n,
                label="",
                reward=float(rng.random() < 0.5),
                status="completed",
                loss_mask=mask,
                rollout_log_probs=[float(torch.tensor(-rng.random() * 3).float()) for _ in range(n)],
                weight_version=0,
                seed=i,
            )
        )
    return samples, write_rollout(path, samples)


def run_config(checkpoint: Path, samples: int = 8, **train: Any) -> RunConfig:
    """Rollouts of `samples` (groups of 4); by default two optimizer steps of 4 samples, two micro-batches
    each at DP=1; KL loss and entropy bonus on."""
    settings = {
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "lr": 1e-3,
        "use_kl_loss": True,
        "kl_loss_coef": 0.1,
        "entropy_coef": 0.01,
        "clip_grad": 1.0,
        "lr_decay_style": "cosine",
    }
    settings.update(train)
    return RunConfig.model_validate(
        {
            "hf_checkpoint": str(checkpoint),
            "rollout": {"rollout_batch_size": samples // 4, "n_samples_per_prompt": 4, "num_rollout": 4},
            "train": settings,
            "checkpoint": {"ci_save_model_hash": True, "save": "/unused"},
        }
    )


def log_prob_rows(ref: ArtifactRef) -> dict[int, dict]:
    """sample_index -> row of a log-prob artifact."""
    return {r["sample_index"]: r for r in read_table(ref).to_pylist()}


def max_row_diff(a: dict[int, dict], b: dict[int, dict], key: str) -> float:
    """Largest absolute difference of column `key` between two log-prob tables."""
    return max(abs(x - y) for i in a for x, y in zip(a[i][key], b[i][key], strict=True))


def spawn_worker(rank: int, world: int, port: int, task: dict[str, Any]) -> None:
    """One rank of a spawned trainer world: train `task["rollout"]` with the Megatron backend at the given
    TP x DP on `task["device"]` (default cpu), save a checkpoint to `task["save"]` when given (collective),
    and write what the comparison needs (log-prob rows, step metrics, this rank's layer hashes; rank 0 also
    the exported weights and their sha256) to `task["out"]/rank{rank}.pt`."""
    from trainers.megatron.trainer import MegatronTrainer

    torch.set_num_threads(1)
    cfg = RunConfig.model_validate(json.loads(task["cfg"]))
    trainer = MegatronTrainer(
        trainer_settings(cfg), task["checkpoint"], rank, world, device=task.get("device", "cpu")
    )
    trainer.setup("127.0.0.1", port)
    rollout = ArtifactRef.model_validate(task["rollout"])
    lp = trainer.compute_log_probs(rollout, task["logprobs"])
    if rank == 0:
        assert lp is not None
        Path(task["out"], "lp_ref.json").write_text(lp.model_dump_json())
    torch.distributed.barrier()
    lp = ArtifactRef.model_validate_json(Path(task["out"], "lp_ref.json").read_text())
    metrics = trainer.train_step(rollout, lp)
    result: dict[str, Any] = {"metrics": metrics, "hash": trainer.model_hash(), "rows": log_prob_rows(lp)}
    weights, sha = trainer.export_weights(), trainer.weights_sha256()  # collective: rank 0 gets them
    if rank == 0:
        result["weights"], result["sha"] = weights, sha
    if task.get("save"):
        trainer.save(task["save"], 0)
    torch.save(result, Path(task["out"]) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


def run_world(world: int, task: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
    """Run `spawn_worker` on `world` spawned ranks (gloo) and return each rank's result; a rank that fails
    fails the caller, and a world that hangs is killed after `timeout` seconds."""
    import time

    import torch.multiprocessing as mp

    context = mp.start_processes(
        spawn_worker, args=(world, free_port(), task), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            raise TimeoutError(f"spawned trainer world of {world} did not finish in {timeout} s")
    return [torch.load(Path(task["out"]) / f"rank{r}.pt", weights_only=False) for r in range(world)]
