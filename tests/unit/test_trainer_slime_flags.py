"""slime's trainer-side flags on both backends: recomputation leaves gradients bitwise unchanged, a group
whose valid samples all scored the same trains nothing, token-budget micro-batches and the per-token loss,
KL reward shaping with whitening, SGD and Megatron's weight-decay rule, deterministic mode. Tiny HF models and
synthetic rollouts (tests/megatron_helpers.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from artifacts.store import read_rollout, read_table, write_rollout
from config import RunConfig
from tests.megatron_helpers import build_hf_model, free_port, run_config, synthetic_rollout
from trainers.settings import trainer_settings
from trainers.torch_trainer.trainer import TorchTrainer

BACKENDS = ["torch", "megatron"]
TOL = 1e-5  # float32, as tests/unit/test_megatron_trainer.py compares the two backends


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_model(tmp_path_factory.mktemp("model") / "qwen2", family="qwen2", vocab=31, layers=3)


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    return synthetic_rollout(tmp_path_factory.mktemp("rollout") / "r.parquet", vocab=30, seed=3)[1]


@pytest.fixture(scope="module")
def shared_rollout(tmp_path_factory, rollout):
    """The rollout with every group's samples on its first prompt (the torch trainer's shared-prompt forward)."""
    samples = read_rollout(rollout)
    first = {s.group_index: s.prompt_tokens for s in reversed(samples)}
    shared = [dataclasses.replace(s, prompt_tokens=first[s.group_index]) for s in samples]
    return write_rollout(tmp_path_factory.mktemp("shared") / "r.parquet", shared)


def _cls(backend: str):
    if backend == "megatron":
        pytest.importorskip("megatron.core")
        from trainers.megatron.trainer import MegatronTrainer

        return MegatronTrainer
    return TorchTrainer


def _trainer(backend: str, cfg: RunConfig, ckpt):
    kwargs = {"device": "cpu"} if backend == "megatron" else {}
    t = _cls(backend)(trainer_settings(cfg), str(ckpt), 0, 1, **kwargs)
    t.setup("127.0.0.1", free_port())
    return t


def _cfg(ckpt, backend: str, **train) -> RunConfig:
    return run_config(ckpt, train_backend=backend, **train)


def _train(t, rollout, tmp_path, name="lp"):
    lp = t.compute_log_probs(rollout, str(tmp_path / f"{name}.parquet"))
    return t.train_step(rollout, lp)


def _attention_calls(t, backend: str) -> list[int]:
    """Calls of each layer's attention output projection (megatron selective: core attention), counted from
    now (before it runs: a recomputation stops once it has what the backward needs)."""
    if backend == "megatron":
        layers = t.model.decoder.layers
        mods = [
            layer.self_attention.core_attention
            if t.s.recompute_granularity == "selective"
            else layer.self_attention.linear_proj
            for layer in layers
        ]
    else:
        mods = [layer.self_attn.o_proj for layer in t.model.model.layers]
    calls = [0] * len(mods)
    for i, m in enumerate(mods):
        m.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "recompute",
    [("full", "uniform", 1), ("full", "block", 1), ("selective", None, None)],
    ids=["full-uniform", "full-block", "selective"],
)
def test_recomputation_leaves_training_bitwise_unchanged(
    ckpt, rollout, shared_rollout, tmp_path, backend, recompute
):
    granularity, method, num = recompute
    for r, data in enumerate([rollout, shared_rollout] if backend == "torch" else [rollout]):
        plain = _trainer(backend, _cfg(ckpt, backend), ckpt)
        redo = _trainer(
            backend,
            _cfg(
                ckpt,
                backend,
                recompute_granularity=granularity,
                recompute_method=method,
                recompute_num_layers=num,
            ),
            ckpt,
        )
        calls = [_attention_calls(plain, backend), _attention_calls(redo, backend)]
        assert _train(plain, data, tmp_path, f"a{r}") == _train(redo, data, tmp_path, f"b{r}")
        after = redo.export_weights()
        assert all(torch.equal(v, after[k]) for k, v in plain.export_weights().items())
        # the recomputed layers' attention ran again in the backward; the others did not
        chosen = {0} if method == "block" else {0, 1, 2}
        for i in range(3):
            assert (calls[1][i] > calls[0][i]) == (i in chosen), (i, calls)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_group_whose_valid_samples_all_scored_1_gets_zero_gradient(ckpt, rollout, tmp_path, backend):
    samples = read_rollout(rollout)
    broken = [
        dataclasses.replace(s, reward=0.0, status="failed", loss_mask=[0] * s.response_length)
        if s.sample_index % 4 == 3
        else dataclasses.replace(s, reward=1.0)
        for s in samples
    ]
    ref = write_rollout(tmp_path / "failed.parquet", broken)
    t = _trainer(backend, _cfg(ckpt, backend, use_kl_loss=False, kl_loss_coef=0.0, entropy_coef=0.0), ckpt)
    steps = _train(t, ref, tmp_path)
    assert [s["train/grad_norm"] for s in steps] == [0.0, 0.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_budget_micro_batches_train_as_the_fixed_ones(ckpt, rollout, tmp_path, backend):
    static = _trainer(backend, _cfg(ckpt, backend), ckpt)
    dynamic = _trainer(backend, _cfg(ckpt, backend, use_dynamic_batch_size=True, max_tokens_per_gpu=14), ckpt)
    samples = static._rollout(rollout)
    assert static._my_micro_batches(samples) != dynamic._my_micro_batches(samples)  # another packing
    for step in dynamic._my_micro_batches(samples):
        for mb in step:
            tokens = sum(len(samples[p].prompt_tokens) + samples[p].response_length for p in mb)
            assert len(mb) == 1 or tokens <= 14
    a, b = _train(static, rollout, tmp_path, "s"), _train(dynamic, rollout, tmp_path, "d")
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y) and max(abs(x[k] - y[k]) for k in x) < TOL
    wa, wb = static.export_weights(), dynamic.export_weights()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4


def test_balance_data_on_one_rank_changes_nothing(ckpt, rollout, tmp_path):
    plain = _trainer("torch", _cfg(ckpt, "torch"), ckpt)
    balanced = _trainer("torch", _cfg(ckpt, "torch", balance_data=True), ckpt)
    samples = plain._rollout(rollout)
    assert plain._my_micro_batches(samples) == balanced._my_micro_batches(samples)
    assert _train(plain, rollout, tmp_path, "p") == _train(balanced, rollout, tmp_path, "b")


def test_per_token_loss_agrees_across_backends_and_differs_from_per_sample(ckpt, rollout, tmp_path):
    runs = {}
    for backend, per_token in (("torch", True), ("megatron", True), ("torch", False)):
        if backend == "megatron":
            pytest.importorskip("megatron.core")
        t = _trainer(backend, _cfg(ckpt, backend, calculate_per_token_loss=per_token), ckpt)
        runs[backend, per_token] = _train(t, rollout, tmp_path, f"{backend}{per_token}")
    for x, y in zip(runs["torch", True], runs["megatron", True], strict=True):
        assert max(abs(x[k] - y[k]) for k in x) < TOL
    assert runs["torch", True][0]["train/entropy_loss"] != runs["torch", False][0]["train/entropy_loss"]


def test_kl_reward_shaping_and_whitening(ckpt, rollout, tmp_path):
    other = build_hf_model(tmp_path / "ref", family="qwen2", vocab=31, layers=3, seed=1)
    train = dict(
        advantage_estimator="reinforce_plus_plus_baseline",
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_coef=0.5,
        kl_loss_type="k1",
        normalize_advantages=True,
    )
    results = []
    for backend in BACKENDS:
        if backend == "megatron":
            pytest.importorskip("megatron.core")
        cfg = _cfg(ckpt, backend, **train).model_copy(update={"ref_load": str(other)})
        t = _trainer(backend, cfg, ckpt)
        assert t.ref_model is not None and not t._fuses_first_step()
        lp = t.compute_log_probs(rollout, str(tmp_path / f"lp-{backend}.parquet"))
        samples = t._rollout(rollout)
        old = t._old_log_probs(samples, t._logprob_rows(lp))
        shaped = t._shaped_advantages(samples, old)
        # by hand: A - kl_coef * (log p - log p_ref) per token, then whitened over the loss tokens
        raw = [
            float(t._advantages(samples)[i]) - 0.5 * (a - b)
            for i, s in enumerate(samples)
            for a, b in zip(
                old[s.sample_index]["log_probs"], old[s.sample_index]["ref_log_probs"], strict=True
            )
        ]
        mask = torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.bool)
        kept = torch.tensor(raw, dtype=torch.float64)[mask]
        want = (torch.tensor(raw, dtype=torch.float64) - kept.mean()) / torch.sqrt(kept.var() + 1e-8)
        got = torch.cat([shaped[i, : s.response_length] for i, s in enumerate(samples)])
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
        results.append(t.train_step(rollout, lp))
    for x, y in zip(*results, strict=True):
        assert max(abs(x[k] - y[k]) for k in x) < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_and_megatrons_weight_decay_rule(ckpt, rollout, tmp_path, backend):
    base = _cfg(ckpt, backend).model_dump()
    train = {**base["train"], "optimizer": "sgd", "sgd_momentum": 0.5, "weight_decay": 0.1}
    t = _trainer(backend, RunConfig.model_validate({**base, "train": train, "checkpoint": {}}), ckpt)
    assert isinstance(t.optimizer, torch.optim.SGD)
    decay = {id(p): g["weight_decay"] for g in t.optimizer.param_groups for p in g["params"]}
    assert all(g["momentum"] == 0.5 for g in t.optimizer.param_groups)
    for name, p in t.model.named_parameters():
        assert decay[id(p)] == (0.0 if name.endswith(".bias") or p.dim() == 1 else 0.1), name
    assert 0.0 in decay.values() and 0.1 in decay.values()
    before = {k: v.clone() for k, v in t.export_weights().items()}
    _train(t, rollout, tmp_path)
    assert any(not torch.equal(before[k], v) for k, v in t.export_weights().items())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sgd_momentum_survives_a_checkpoint(ckpt, rollout, tmp_path, backend):
    base = _cfg(ckpt, backend).model_dump()
    train = {**base["train"], "optimizer": "sgd", "sgd_momentum": 0.5}
    cfg = RunConfig.model_validate({**base, "train": train})
    first = _trainer(backend, cfg, ckpt)
    _train(first, rollout, tmp_path, "first")
    first.save(str(tmp_path / "save"), 0)
    second = _trainer(backend, cfg, ckpt)
    assert second.load(str(tmp_path / "save")) == 0
    buffers = [
        [first.optimizer.state[p]["momentum_buffer"] for p in first.params],
        [second.optimizer.state[p]["momentum_buffer"] for p in second.params],
    ]
    assert all(torch.equal(a, b) for a, b in zip(*buffers, strict=True))
    adam = _trainer(backend, _cfg(ckpt, backend), ckpt)
    with pytest.raises(ValueError, match="resume with the --optimizer"):
        adam.load(str(tmp_path / "save"))


def test_deterministic_mode_turns_on_torchs_deterministic_algorithms(ckpt, rollout, tmp_path):
    try:
        t = _trainer("torch", _cfg(ckpt, "torch", deterministic_mode=True), ckpt)
        assert torch.are_deterministic_algorithms_enabled()
        _train(t, rollout, tmp_path)  # every op the trainer runs has a deterministic kernel
    finally:
        torch.use_deterministic_algorithms(False)


def test_megatron_data_parallel_2_with_token_budget_balance_per_token_loss_and_whitening(
    ckpt, rollout, tmp_path
):
    """Two DP ranks agree on the packed and balanced schedule, the step's token count and the whitening
    statistics: the same training as one rank within float32 rounding (the micro-batches differ)."""
    pytest.importorskip("megatron.core")
    from config import DebugConfig
    from tests.megatron_helpers import run_world

    flags = dict(
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=14,
        balance_data=True,
        calculate_per_token_loss=True,
        normalize_advantages=True,
    )
    det = DebugConfig(debug_deterministic_collective=True)
    cfg2 = _cfg(ckpt, "megatron", data_parallel_size=2, **flags).model_copy(update={"debug": det})
    task = {
        "cfg": cfg2.model_dump_json(),
        "checkpoint": str(ckpt),
        "rollout": rollout.model_dump(),
        "logprobs": str(tmp_path / "lp_dp2.parquet"),
        "out": str(tmp_path),
    }
    dp2 = run_world(2, task)
    assert dp2[0]["metrics"] == dp2[1]["metrics"]
    dp1 = _trainer("megatron", _cfg(ckpt, "megatron", **flags).model_copy(update={"debug": det}), ckpt)
    for x, y in zip(_train(dp1, rollout, tmp_path), dp2[0]["metrics"], strict=True):
        assert sorted(x) == sorted(y) and max(abs(x[k] - y[k]) for k in x) < TOL
    one, two = dp1.export_weights(), dp2[0]["weights"]
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_checkpoint_of_one_param_group_loads_into_the_weight_decay_groups(ckpt, rollout, tmp_path, backend):
    """A run saved without weight decay (one param group) resumes with it (a group per run of decay)."""
    plain = _trainer(backend, _cfg(ckpt, backend, weight_decay=0.0), ckpt)
    _train(plain, rollout, tmp_path, "first")
    plain.save(str(tmp_path / "save"), 0)
    decayed = _trainer(backend, _cfg(ckpt, backend, weight_decay=0.1), ckpt)
    assert len(plain.optimizer.param_groups) == 1 < len(decayed.optimizer.param_groups)
    assert decayed.load(str(tmp_path / "save")) == 0
    lrs = {g["lr"] for g in decayed.optimizer.param_groups}
    assert lrs == {plain.optimizer.param_groups[0]["lr"]}
    assert decayed.global_step == plain.global_step


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loss_plug_in_gets_the_per_token_reduction(ckpt, rollout, tmp_path, backend):
    """--loss-type sft_loss with --calculate-per-token-loss: each step's loss is minus the mean log-prob over the
    step's loss tokens (each sample counting at least one)."""
    base = _cfg(
        ckpt, backend, calculate_per_token_loss=True, use_kl_loss=False, kl_loss_coef=0.0
    ).model_dump()
    cfg = RunConfig.model_validate({**base, "loss": {"loss_type": "sft_loss"}})
    t = _trainer(backend, cfg, ckpt)
    lp = t.compute_log_probs(rollout, str(tmp_path / "lp.parquet"))
    rows = {r["sample_index"]: r["log_probs"] for r in read_table(lp).to_pylist()}
    steps = t.train_step(rollout, lp)
    samples = sorted(read_rollout(rollout), key=lambda s: s.sample_index)
    first = samples[: t.s.global_batch_size]
    total = sum(x for s in first for x, m in zip(rows[s.sample_index], s.loss_mask, strict=True) if m)
    tokens = sum(max(sum(s.loss_mask), 1) for s in first)
    assert abs(steps[0]["train/loss"] - (-total / tokens)) < TOL
