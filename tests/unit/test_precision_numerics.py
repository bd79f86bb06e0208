"""--precision bf16 in-process: the engine holds bfloat16 weights and KV cache and returns float32 log-probs close
to the float32 engine's, replays bitwise at one precision; the torch trainer keeps float32 master weights,
gradients and optimizer state under autocast; engine and trainer weight hashes compare like with like; the doctor
names an engine/trainer precision mismatch.

Bounds are stated from bfloat16's 8-bit mantissa (a relative rounding of 2^-8 per matmul input), not measured on
one CPU: bf16 kernels differ between AVX-512 BF16 and AMX, so only what every bfloat16 kernel guarantees is held."""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import pytest
import torch
import yaml

from artifacts.hashing import as_dtype, tensor_hashes
from artifacts.store import RunPaths, read_metadata, read_rollout, read_table, write_rollout
from config import RunConfig
from engines.base import GenerateRequest, SamplingParams
from engines.torch_engine.decoder import FastDecoder
from engines.torch_engine.engine import TorchEngine
from flows.doctor import diagnose
from tests.doctor_runs import Plan, make_run, tokenizer_dir
from tests.unit.test_engine_trainer import _config, _rollout
from trainers.settings import trainer_settings

# The largest log-prob difference between a bf16 and an fp32 forward of the same small model that these tests
# accept: bf16 rounds every matmul input to ~3 significant digits, which moves a log-prob by a few hundredths
# through the tiny model's two layers; a wrong dtype path (a bf16 log-softmax, weights not loaded) is off by far more.
BF16_LOGP_TOL = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engines(base_checkpoint):
    return TorchEngine(base_checkpoint), TorchEngine(base_checkpoint, precision="bf16")


def _requests(n: int = 12, new: int = 16) -> list[GenerateRequest]:
    params = SamplingParams(temperature=1.0, max_new_tokens=new)
    return [
        GenerateRequest(prompt_tokens=(3 + i % 5, 4, 5 + i % 3, 6), params=params, seed=100 + i)
        for i in range(n)
    ]


def test_a_bf16_engine_holds_bf16_weights_and_cache_and_returns_float32_logits(engines):
    _, e16 = engines
    assert {t.dtype for t in e16.model.state_dict().values() if t.is_floating_point()} == {torch.bfloat16}
    assert e16.health()["dtype"] == "bfloat16" and engines[0].health()["dtype"] == "float32"
    assert FastDecoder.supports(e16.model)
    decoder = e16._decoder(12)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.inference_mode():
        logits = decoder.prefill(ids, torch.arange(4)[None], torch.ones(1, 12, dtype=torch.bool))
    assert logits.dtype == torch.float32
    assert isinstance(decoder, FastDecoder) and decoder.kv[0][0].dtype == torch.bfloat16
    # every step's float32 logits go to one buffer (a fresh [B, V] a step would fault its pages in each time)
    with torch.inference_mode():
        steps = [decoder.decode(torch.tensor([7]), torch.tensor([4 + i])).clone() for i in range(2)]
        again = decoder.decode(torch.tensor([8]), torch.tensor([6]))
    assert again.data_ptr() == logits.data_ptr() and not torch.equal(steps[0], steps[1])


def test_bf16_log_probs_are_close_to_fp32_and_replay_bitwise(engines):
    e32, e16 = engines
    reqs = _requests()
    out16, again = e16.generate(reqs), e16.generate(reqs)
    assert [(o.response_tokens, o.log_probs) for o in out16] == [
        (o.response_tokens, o.log_probs) for o in again
    ]
    # both engines score the same tokens (those the bf16 engine sampled): log-softmax of full-sequence logits
    ids = torch.tensor(
        [
            list(r.prompt_tokens) + list(o.response_tokens[:6])
            for r, o in zip(reqs, out16, strict=True)
            if len(o.response_tokens) >= 6
        ]
    )
    with torch.inference_mode():
        lp32 = e32.model(input_ids=ids).logits.float().log_softmax(-1)
        lp16 = e16.model(input_ids=ids).logits.float().log_softmax(-1)
    picked = ids[:, 1:, None]
    diff = (lp32[:, :-1].gather(-1, picked) - lp16[:, :-1].gather(-1, picked)).abs()
    assert 0 < float(diff.max()) < BF16_LOGP_TOL  # not the same computation, and close


def _trainer(cfg, checkpoint):
    from trainers.torch_trainer.trainer import TorchTrainer

    trainer = TorchTrainer(trainer_settings(cfg), checkpoint, rank=0, world_size=1)
    trainer.setup("127.0.0.1", _free_port())
    return trainer


def test_the_bf16_trainer_keeps_float32_master_weights_optimizer_state_and_log_probs(
    engines, base_checkpoint, tmp_path
):
    cfg = _config(base_checkpoint, tmp_path, precision="bf16")
    assert trainer_settings(cfg).precision == "bf16"
    samples, ref = _rollout(engines[1], cfg, tmp_path)
    trainer = _trainer(cfg, base_checkpoint)
    lp_ref = trainer.compute_log_probs(ref, str(tmp_path / "lp.parquet"))
    table = read_table(lp_ref)
    rows = {r["sample_index"]: r for r in table.to_pylist()}
    gaps = [
        abs(a - b)
        for s in samples
        for a, b in zip(s.rollout_log_probs, rows[s.sample_index]["log_probs"], strict=True)
    ]
    assert max(gaps) < BF16_LOGP_TOL  # the bf16 engine and the autocast trainer score alike
    again = trainer._token_outputs(trainer.model, trainer._micro_batch(trainer._rollout(ref), [0, 1, 2, 3]))
    assert again[0].dtype == torch.float32 and again[1].dtype == torch.float32
    metrics = trainer.train_step(ref, lp_ref)
    # the old log-probs were computed by the same autocast forward: ratio 1 bitwise at the first step
    assert metrics[0]["train/ppo_kl"] == 0.0 and metrics[0]["train/pg_clipfrac"] == 0.0
    assert {p.dtype for p in trainer.params} == {torch.float32}
    trainer.model.zero_grad(set_to_none=True)
    lp, _ = trainer._token_outputs(trainer.model, trainer._micro_batch(trainer._rollout(ref), [0, 1]))
    lp.sum().backward()  # the autocast forward's gradients reach the float32 master weights as float32
    assert {p.grad.dtype for p in trainer.params if p.grad is not None} == {torch.float32}
    state = [v for st in trainer.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    assert state and {v.dtype for v in state if v.dim()} == {torch.float32}


def test_the_autocast_forward_is_the_bf16_one(base_checkpoint, tmp_path):
    """The same weights under --precision bf16 and fp32 give log-probs that differ (the forward did run in
    bfloat16), within the bf16 bound."""
    out = {}
    for precision in ("fp32", "bf16"):
        cfg = _config(base_checkpoint, tmp_path / precision, precision=precision)
        trainer = _trainer(cfg, base_checkpoint)
        _, ref = _rollout(TorchEngine(base_checkpoint), cfg, tmp_path / precision)
        mb = trainer._micro_batch(trainer._rollout(ref), [0, 1, 2, 3])
        with torch.no_grad():
            out[precision] = trainer._token_outputs(trainer.model, mb)[0]
    diff = (out["fp32"] - out["bf16"]).abs().max()
    assert 0 < float(diff) < BF16_LOGP_TOL


def test_the_bf16_forward_caches_no_weight_copy_and_computes_what_autocasts_cache_would(
    engines, base_checkpoint, tmp_path
):
    """Autocast's cache would hold a bfloat16 copy of every weight until the forward ends; the trainer's forward
    runs without it, and its log-probs and float32 gradients are bitwise those of a forward with it."""
    cfg = _config(base_checkpoint, tmp_path, precision="bf16")
    trainer = _trainer(cfg, base_checkpoint)
    _, ref = _rollout(engines[1], cfg, tmp_path)
    mb = trainer._micro_batch(trainer._rollout(ref), [0, 1, 2, 3])
    with trainer._autocast():
        assert not torch.is_autocast_cache_enabled()

    def outputs_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        trainer.model.zero_grad(set_to_none=True)
        lp, _ = trainer._token_outputs(trainer.model, mb)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in trainer.params if p.grad is not None]

    without = outputs_and_grads()
    trainer._autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=True)  # type: ignore[method-assign]
    cached = outputs_and_grads()
    assert torch.equal(without[0], cached[0])
    assert len(without[1]) == len(cached[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(without[1], cached[1], strict=True))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_engine_and_trainer_hashes_compare_like_with_like(engines, base_checkpoint, tmp_path, precision):
    cfg = _config(base_checkpoint, tmp_path, precision=precision)
    trainer = _trainer(cfg, base_checkpoint)
    engine = TorchEngine(base_checkpoint, precision=precision)
    engine.snapshot_and_scramble(seed=1)
    assert engine.tensor_hashes() != trainer.tensor_hashes()
    engine.update_weights(trainer.export_weights(), 1)  # float32 weights, cast by a bf16 engine
    assert engine.tensor_hashes() == trainer.tensor_hashes()
    assert engine.weights_sha256() == trainer.weights_sha256()
    held = torch.bfloat16 if precision == "bf16" else None
    sent = trainer.export_weights(held)  # what a sync sends: already in the engines' dtype
    assert {t.dtype for t in sent.values()} == {held or torch.float32}
    assert tensor_hashes(sent) == trainer.tensor_hashes()
    engine.snapshot_and_scramble(seed=2)
    engine.update_weights(sent, 2)
    assert engine.weights_sha256() == trainer.weights_sha256()
    master = tensor_hashes(trainer.model.state_dict())
    assert (master == trainer.tensor_hashes()) == (precision == "fp32")  # bf16: the cast, not the master
    assert tensor_hashes(as_dtype(trainer.model.state_dict(), None)) == master
    # the streamed sync: the same tensors, every weight once, each copied straight into the engines' dtype, in
    # buckets counted in those bytes (tiny-arith's model is ~1.3 MB in float32)
    streamed = list(trainer.iter_weights(100_000, held))
    assert len(streamed) > 2 and all(sum(t.nbytes for t in b.values()) < 400_000 for b in streamed)
    flat = {k: v for b in streamed for k, v in b.items()}
    assert sum(map(len, streamed)) == len(flat) and tensor_hashes(flat) == tensor_hashes(sent)
    master_ptrs = {t.data_ptr() for t in trainer.model.state_dict().values()}
    assert not master_ptrs & {t.data_ptr() for t in flat.values()}  # copies, never the live weights


# -- the doctor's precision-mismatch rule -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("tok"))


def _restamp(path: Path, **metadata: str) -> None:
    """Rewrite a rollout file with more file metadata (what the run's engines recorded)."""
    meta = {
        k: v for k, v in read_metadata(path).items() if k not in ("schema_version", "kind", "content_sha256")
    }
    write_rollout(path, read_rollout(path), metadata={**meta, **metadata})


def test_the_doctor_names_rollouts_generated_at_another_precision_than_the_trainer(tmp_path, tokenizer):
    run = make_run(tmp_path, tokenizer, Plan())
    assert not [f for f in diagnose(run) if f.rule == "precision-mismatch"]  # a run that records none
    paths = RunPaths(run)
    for rid in range(3):
        _restamp(paths.rollout(rid), precision="fp32")
    assert not [
        f for f in diagnose(run) if f.rule == "precision-mismatch"
    ]  # agrees with train.precision fp32
    _restamp(paths.rollout(0), precision="bf16")
    first = next(f for f in diagnose(run) if f.rule == "precision-mismatch")
    assert first.severity == "error"
    assert "engines at bf16" in first.title and "trainer computes at fp32" in first.title
    assert "train.precision = fp32" in first.evidence and "--precision bf16" in first.knife


def test_the_doctor_follows_a_loaded_recording_to_its_engines_precision(tmp_path, tokenizer):
    run = make_run(tmp_path, tokenizer, dataclasses.replace(Plan(), config={"train": {"precision": "bf16"}}))
    paths = RunPaths(run)
    recording = tmp_path / "rec.parquet"
    write_rollout(recording, read_rollout(paths.rollout(0)), metadata={"precision": "fp32"})
    _restamp(paths.rollout(0), recorded_from=str(recording))
    first = next(f for f in diagnose(run) if f.rule == "precision-mismatch")
    assert "(a recording)" in first.title and str(recording) in first.evidence and "bf16" in first.title


def test_the_doctor_names_an_sglang_dtype_other_than_the_trainers_precision(tmp_path, tokenizer):
    run = make_run(tmp_path, tokenizer, Plan())
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["rollout"]["rollout_backend"] = "sglang"  # as an SGLang engine backend's run records it
    config["sglang"]["sglang_server_args"] = {"dtype": "bfloat16"}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    first = next(f for f in diagnose(run) if f.rule == "precision-mismatch")
    assert "SGLang engines compute in bfloat16 but the trainer at fp32" in first.title
    config["train"]["precision"] = "bf16"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert not [f for f in diagnose(run) if f.rule == "precision-mismatch"]


def test_a_run_config_is_validated_with_its_precision():
    assert RunConfig.model_validate({"train": {"precision": "bf16"}}).train.precision == "bf16"


@pytest.mark.parametrize(("t", "length"), [(5, 5), (1, 9)])  # a prefill and a decode step
def test_grouped_attention_is_sdpa_with_grouped_heads(t, length):
    from engines.torch_engine.decoder import grouped_attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, t, 8, generator=gen)
    k, v = torch.randn(3, 2, length, 8, generator=gen), torch.randn(3, 2, length, 8, generator=gen)
    mask = torch.ones(3, 1, t, length, dtype=torch.bool).tril(length - t)
    mask[0, ..., :2] = False  # a left-padded row
    mask[0, 0, :, :2] |= torch.eye(t, length, dtype=torch.bool)[:, :2]  # a padding query sees itself
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(grouped_attention(q, k, v, mask), want, atol=1e-5)
    got16 = grouped_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    assert got16.dtype == torch.bfloat16 and torch.allclose(got16.float(), want, atol=0.1)


def test_the_output_layer_matmul_in_bf16_keeps_a_float32_log_softmax_and_gradient():
    from trainers.losses import linear_log_probs_and_entropy

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 16, generator=gen).requires_grad_()
    weight = (torch.randn(300, 16, generator=gen) * 0.3).requires_grad_()
    tokens = torch.randint(0, 300, (40,), generator=gen)
    lp, _ = linear_log_probs_and_entropy(hidden, weight, tokens, matmul_dtype=torch.bfloat16, chunk_rows=16)
    logits = (hidden.detach().bfloat16() @ weight.detach().bfloat16().t()).float()  # as a bf16 engine's
    want = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert lp.dtype == torch.float32 and torch.allclose(lp, want, atol=1e-5)
    lp.sum().backward()
    assert hidden.grad is not None and weight.grad is not None and weight.grad.dtype == torch.float32
    h32, w32 = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    lp32, _ = linear_log_probs_and_entropy(h32, w32, tokens, chunk_rows=16)
    lp32.sum().backward()
    assert 0 < float((lp - lp32).abs().max()) < BF16_LOGP_TOL
    assert w32.grad is not None and float((weight.grad - w32.grad).norm() / w32.grad.norm()) < 0.05
