"""The Megatron backend against the torch backend, itself at other parallel layouts, and its checkpoints.

Tiny HF models are built at test time; the rollout is synthetic (ragged prompts and responses, masked
tokens, the pad token inside prompts). TP=2 and DP=2 worlds run in spawned processes over gloo."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

pytest.importorskip("megatron.core")

from artifacts.checkpoints import damage  # noqa: E402
from artifacts.hashing import tensor_hashes  # noqa: E402
from artifacts.lint import lint_checkpoint  # noqa: E402
from config import DebugConfig, RunConfig  # noqa: E402
from tests.helpers import fail_second_scheduler_step  # noqa: E402
from tests.megatron_helpers import (  # noqa: E402
    build_hf_model,
    free_port,
    log_prob_rows,
    max_row_diff,
    run_config,
    run_world,
    synthetic_rollout,
)
from trainers.megatron.trainer import MegatronTrainer  # noqa: E402
from trainers.settings import trainer_settings
from trainers.torch_trainer.trainer import TorchTrainer  # noqa: E402

TOL = 1e-5  # float32: the bound for log-probs, loss and grad norm


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron-models")
    return {
        "qwen2-tied": build_hf_model(root / "qwen2", family="qwen2", tied=True, vocab=31),
        "llama-untied": build_hf_model(root / "llama", family="llama", tied=False, vocab=30),
        "qwen3-untied": build_hf_model(root / "qwen3", family="qwen3", tied=False, vocab=31),
    }


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron-rollouts")
    # token ids < 30: valid for both models (vocab 31 and 30)
    return [synthetic_rollout(root / f"r{i}.parquet", vocab=30, seed=i, rollout_id=i)[1] for i in range(2)]


def _trainer(cls, cfg: RunConfig, checkpoint, **kwargs) -> TorchTrainer | MegatronTrainer:
    if cls is MegatronTrainer:
        kwargs.setdefault("device", "cpu")  # the CPU suite stays on the CPU where a GPU is present too
    trainer = cls(trainer_settings(cfg), str(checkpoint), 0, 1, **kwargs)
    trainer.setup("127.0.0.1", free_port())
    return trainer


def _megatron_cfg(checkpoint, **train) -> RunConfig:
    return run_config(checkpoint, train_backend="megatron", **train)


def _max_weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("model", ["qwen2-tied", "llama-untied", "qwen3-untied"])
def test_log_probs_and_train_step_match_the_torch_backend(models, rollouts, tmp_path, model):
    ckpt, rollout = models[model], rollouts[0]
    torch_t = _trainer(TorchTrainer, run_config(ckpt), ckpt)
    mega = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    assert mega.weights_sha256() == torch_t.weights_sha256()  # conversion is exact: same export, same hash

    lp_torch = torch_t.compute_log_probs(rollout, str(tmp_path / "lp_torch.parquet"))
    lp_mega = mega.compute_log_probs(rollout, str(tmp_path / "lp_mega.parquet"))
    rows_torch, rows_mega = log_prob_rows(lp_torch), log_prob_rows(lp_mega)
    diffs = {k: max_row_diff(rows_torch, rows_mega, k) for k in ("log_probs", "entropy", "ref_log_probs")}
    print(f"{model}: max |megatron - torch| {diffs}")
    assert max(diffs.values()) < TOL

    steps_torch, steps_mega = torch_t.train_step(rollout, lp_torch), mega.train_step(rollout, lp_mega)
    assert len(steps_mega) == 2
    assert steps_mega[0]["train/ppo_kl"] == 0.0 and steps_mega[0]["train/pg_clipfrac"] == 0.0
    assert steps_mega[0]["train/grad_norm"] > 1.0  # the clip at 1.0 acted, so clipping is compared too
    for st, sm in zip(steps_torch, steps_mega, strict=True):
        assert sorted(st) == sorted(sm)
        worst = max(abs(st[k] - sm[k]) for k in st)
        print(f"{model}: step {sm['train/step']} max |metric diff| {worst:.3g}")
        assert worst < TOL
    assert _max_weight_diff(torch_t.export_weights(), mega.export_weights()) < 1e-4
    assert mega.train_step(rollout, lp_mega) is steps_mega  # a retry never applies the rollout twice


def test_failed_step_restores_weights_optimizer_and_schedule(models, rollouts, tmp_path):
    ckpt, rollout = models["qwen2-tied"], rollouts[0]
    clean = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    expected = clean.train_step(rollout, clean.compute_log_probs(rollout, str(tmp_path / "lp0.parquet")))
    trainer = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    lp = trainer.compute_log_probs(rollout, str(tmp_path / "lp.parquet"))
    initial = trainer.export_weights()
    restore_step = fail_second_scheduler_step(trainer)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train_step(rollout, lp)
    assert all(torch.equal(initial[k], v) for k, v in trainer.export_weights().items())
    assert not trainer.optimizer.state and trainer.global_step == 0 and trainer.scheduler.last_epoch == 0
    restore_step()
    assert trainer.train_step(rollout, lp) == expected
    assert all(torch.equal(clean.export_weights()[k], v) for k, v in trainer.export_weights().items())


# Qwen2's and Qwen3's vocab 31 is padded to 32 at TP=2
@pytest.mark.parametrize("model", ["qwen2-tied", "llama-untied", "qwen3-untied"])
def test_tensor_parallel_2_matches_1_and_its_checkpoint_loads_at_tp_1(models, rollouts, tmp_path, model):
    ckpt, rollout = models[model], rollouts[0]
    cfg2 = _megatron_cfg(ckpt, tensor_model_parallel_size=2)
    task = {
        "cfg": cfg2.model_dump_json(),
        "checkpoint": str(ckpt),
        "rollout": rollout.model_dump(),
        "logprobs": str(tmp_path / "lp_tp2.parquet"),
        "out": str(tmp_path),
        "save": str(tmp_path / "save"),
    }
    tp2 = run_world(2, task)
    assert tp2[0]["metrics"] == tp2[1]["metrics"]  # both TP ranks report the replica's metrics
    assert tp2[0]["hash"] != tp2[1]["hash"]  # ... from different shards

    tp1 = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    lp = tp1.compute_log_probs(rollout, str(tmp_path / "lp_tp1.parquet"))
    diffs = {
        k: max_row_diff(log_prob_rows(lp), tp2[0]["rows"], k)
        for k in ("log_probs", "entropy", "ref_log_probs")
    }
    steps = tp1.train_step(rollout, lp)
    metric_diff = max(abs(a[k] - b[k]) for a, b in zip(steps, tp2[0]["metrics"], strict=True) for k in a)
    print(f"{model} TP=2 vs TP=1: log-prob diffs {diffs}, max metric diff {metric_diff:.3g}")
    assert max(diffs.values()) < TOL and metric_diff < TOL
    assert _max_weight_diff(tp1.export_weights(), tp2[0]["weights"]) < 1e-4

    saved = tmp_path / "save" / "iter_0000000"
    assert {
        "metadata.json",
        "common.pt",
        ".metadata",
        "model.safetensors",
        "config.json",
        "model_hash_tp0_pp0_dp0_cp0.json",
        "model_hash_tp1_pp0_dp0_cp0.json",
    } <= {p.name for p in saved.iterdir()}
    assert json.loads((saved / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    moments_tp1 = {n: tp1.optimizer.state[p]["exp_avg"].clone() for n, p in tp1.model.named_parameters()}
    fresh = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    assert fresh.load(str(tmp_path / "save")) == 0 and fresh.global_step == 2
    loaded = fresh.export_weights()
    assert all(torch.equal(loaded[k], v) for k, v in tp2[0]["weights"].items())  # resharded 2 -> 1, bitwise
    assert fresh.weights_sha256() == tp2[0]["sha"]
    moment_diff = max(
        (fresh.optimizer.state[p]["exp_avg"] - moments_tp1[n]).abs().max().item()
        for n, p in fresh.model.named_parameters()
    )
    assert moment_diff < 1e-4  # the AdamW moments were saved sharded and resharded too
    assert fresh.optimizer.param_groups[0]["lr"] == tp1.optimizer.param_groups[0]["lr"]


def test_data_parallel_2_equals_1_with_two_micro_batches_bitwise(models, rollouts, tmp_path):
    ckpt, rollout = models["llama-untied"], rollouts[1]
    det = DebugConfig(debug_deterministic_collective=True)
    cfg2 = _megatron_cfg(ckpt, data_parallel_size=2).model_copy(update={"debug": det})
    task = {
        "cfg": cfg2.model_dump_json(),
        "checkpoint": str(ckpt),
        "rollout": rollout.model_dump(),
        "logprobs": str(tmp_path / "lp_dp2.parquet"),
        "out": str(tmp_path),
        "save": str(tmp_path / "dp2"),
    }
    dp2 = run_world(2, task)

    cfg1 = _megatron_cfg(ckpt).model_copy(update={"debug": det})
    assert cfg1.micro_batch_size == 2 and cfg1.global_batch_size == 4  # DP=1 accumulates two micro-batches
    dp1 = _trainer(MegatronTrainer, cfg1, ckpt)
    lp = dp1.compute_log_probs(rollout, str(tmp_path / "lp_dp1.parquet"))
    assert log_prob_rows(lp) == dp2[0]["rows"]
    assert dp1.train_step(rollout, lp) == dp2[0]["metrics"] == dp2[1]["metrics"]
    dp1.save(str(tmp_path / "dp1"), 1)
    one = json.loads((tmp_path / "dp1" / "iter_0000001" / "model_hash_tp0_pp0_dp0_cp0.json").read_text())
    two = [
        json.loads((tmp_path / "dp2" / "iter_0000000" / f"model_hash_tp0_pp0_dp{d}_cp0.json").read_text())
        for d in (0, 1)
    ]
    assert len(one) == 3 and one == two[0] == two[1]  # layer_0000, layer_0001, non_layer


def test_save_load_round_trip_resumes_bitwise(models, rollouts, tmp_path):
    ckpt = models["llama-untied"]
    cfg = _megatron_cfg(ckpt).model_copy(
        update={
            "checkpoint": RunConfig().checkpoint.model_copy(
                update={
                    "save": str(tmp_path),
                    "ci_save_model_hash": True,
                    "load": str(tmp_path),
                    "ci_check_model_hash": True,
                }
            )
        }
    )
    first = _trainer(MegatronTrainer, cfg, ckpt)
    lp0 = first.compute_log_probs(rollouts[0], str(tmp_path / "lp0.parquet"))
    first.train_step(rollouts[0], lp0)
    first.save(str(tmp_path), 0)
    at_save = tensor_hashes(first.export_weights())
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "0"
    assert damage(tmp_path / "iter_0000000") is None  # a resume finds nothing wrong in a whole one
    assert lint_checkpoint(tmp_path / "iter_0000000").problems == []  # nor `--load` and `lint-ckpt`

    resumed = _trainer(MegatronTrainer, cfg, ckpt)
    assert resumed.load(str(tmp_path)) == 0 and resumed.last_applied_rollout == 0 and resumed.global_step == 2
    assert resumed.optimizer.param_groups[0]["lr"] == first.optimizer.param_groups[0]["lr"]
    for (_, p), (_, q) in zip(first.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(p, q)
        assert all(
            torch.equal(first.optimizer.state[p][k], resumed.optimizer.state[q][k])
            for k in ("step", "exp_avg", "exp_avg_sq")
        )
    # the apply-once guard travels in the checkpoint: rollout 0 again returns its metrics and changes nothing
    before = resumed.weights_sha256()
    again = resumed.train_step(rollouts[0], lp0)
    assert again == first.applied[0] and resumed.weights_sha256() == before
    steps = [
        t.train_step(rollouts[1], t.compute_log_probs(rollouts[1], str(tmp_path / f"lp1_{i}.parquet")))
        for i, t in enumerate((first, resumed))
    ]
    assert steps[0] == steps[1]
    assert first.weights_sha256() == resumed.weights_sha256()

    hash_file = tmp_path / "iter_0000000" / "model_hash_tp0_pp0_dp0_cp0.json"
    hashes = json.loads(hash_file.read_text())
    hash_file.write_text(json.dumps({**hashes, "layer_0001": "0" * 64}))  # a planted corruption
    with pytest.raises(RuntimeError, match="layer_0001"):
        _trainer(MegatronTrainer, cfg, ckpt).load(str(tmp_path))

    # content hashes: the HF export's tensors as the weights hash them, every item of the shards by its bytes
    saved = tmp_path / "iter_0000000"
    recorded = json.loads((saved / "tensor_hashes.json").read_text())["files"]
    assert recorded["model.safetensors"]["tensors"] == at_save
    shard = next(f for f in recorded if f.endswith(".distcp"))
    key, (offset, length, want) = max(recorded[shard]["ranges"].items(), key=lambda kv: kv[1][1])
    data = bytearray((saved / shard).read_bytes())
    data[offset + length // 2] ^= 0x40  # a byte inside the largest stored tensor
    (saved / shard).write_bytes(bytes(data))
    got = hashlib.sha256(data[offset : offset + length]).hexdigest()
    problem = f"{shard}: item {key}: saved sha256 {want[:12]}, read sha256 {got[:12]}"
    with pytest.raises(ValueError) as e:
        _trainer(MegatronTrainer, cfg, ckpt).load(str(tmp_path))
    assert str(e.value) == (
        f"--load {saved}: {problem} (the file changed after its save; --no-verify-checkpoint loads it anyway)"
    )
    assert [str(p) for p in lint_checkpoint(saved).problems] == [problem]


def test_load_of_an_hf_dir_and_of_a_torch_backend_checkpoint(models, rollouts, tmp_path):
    ckpt, other = (
        models["qwen2-tied"],
        build_hf_model(tmp_path / "other", family="qwen2", tied=True, vocab=31, seed=1),
    )
    mega = _trainer(MegatronTrainer, _megatron_cfg(ckpt), ckpt)
    assert mega.load(str(other)) == -1  # an HF dir carries weights only
    reference = _trainer(TorchTrainer, run_config(other), other)
    assert mega.weights_sha256() == reference.weights_sha256()

    torch_t = _trainer(TorchTrainer, run_config(ckpt), ckpt)
    torch_t.train_step(rollouts[0], torch_t.compute_log_probs(rollouts[0], str(tmp_path / "lp0.parquet")))
    torch_t.save(str(tmp_path / "torch_save"), 0)
    assert mega.load(str(tmp_path / "torch_save")) == 0 and mega.global_step == 2
    assert mega.weights_sha256() == torch_t.weights_sha256()
    assert mega.optimizer.param_groups[0]["lr"] == torch_t.optimizer.param_groups[0]["lr"]
    # the AdamW moments came across too: the next rollout trains as the torch backend does
    steps = [
        t.train_step(rollouts[1], t.compute_log_probs(rollouts[1], str(tmp_path / f"lp1_{i}.parquet")))
        for i, t in enumerate((torch_t, mega))
    ]
    worst = max(abs(a[k] - b[k]) for a, b in zip(*steps, strict=True) for k in a)
    assert worst < TOL and math.isfinite(worst)


@pytest.mark.gpu
def test_on_cuda_log_probs_and_train_step_match_the_torch_backend(models, rollouts, tmp_path):
    """The same equivalence with the Megatron model on the GPU (in its own process: a process runs megatron
    on one kind of device) against the torch backend on the CPU."""
    ckpt, rollout = models["qwen2-tied"], rollouts[0]
    task = {
        "cfg": _megatron_cfg(ckpt).model_dump_json(),
        "checkpoint": str(ckpt),
        "rollout": rollout.model_dump(),
        "logprobs": str(tmp_path / "lp_cuda.parquet"),
        "out": str(tmp_path),
        "device": "cuda",
    }
    (cuda,) = run_world(1, task)
    torch_t = _trainer(TorchTrainer, run_config(ckpt), ckpt)
    lp = torch_t.compute_log_probs(rollout, str(tmp_path / "lp_cpu.parquet"))
    diffs = {
        k: max_row_diff(log_prob_rows(lp), cuda["rows"], k) for k in ("log_probs", "entropy", "ref_log_probs")
    }
    steps = torch_t.train_step(rollout, lp)
    worst = max(abs(a[k] - b[k]) for a, b in zip(steps, cuda["metrics"], strict=True) for k in a)
    print(f"CUDA megatron vs CPU torch: log-prob diffs {diffs}, max metric diff {worst:.3g}")
    assert max(diffs.values()) < TOL and worst < TOL
    assert _max_weight_diff(torch_t.export_weights(), cuda["weights"]) < 1e-4


def test_world_size_is_tp_times_dp_and_unsupported_parallelism_is_refused():
    train = {
        "train_backend": "megatron",
        "tensor_model_parallel_size": 2,
        "data_parallel_size": 2,
        "global_batch_size": 8,
    }
    assert RunConfig.model_validate({"train": train}).trainer_world_size == 4
    with pytest.raises(ValueError, match="--sequence-parallel with --tensor-model-parallel-size 2: .*drop"):
        RunConfig.model_validate({"train": {**train, "sequence_parallel": True}})
    # at TP 1 Megatron's sequence parallelism is a no-op: slime's scripts pass it anyway
    assert RunConfig.model_validate(
        {"train": {**train, "tensor_model_parallel_size": 1, "sequence_parallel": True}}
    )
    for change, needle in (
        ({"pipeline_model_parallel_size": 2}, "--pipeline-model-parallel-size 2: not supported"),
        ({"context_parallel_size": 2}, "--context-parallel-size 2: not supported"),
    ):
        with pytest.raises(ValueError, match=needle) as e:
            RunConfig.model_validate({"train": {**train, **change}})
        assert "megatron backend runs tensor and data parallel only" in str(e.value)
