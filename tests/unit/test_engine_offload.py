"""--offload-rollout on the embedded engine: released weights free their storage, the engine refuses work until a
full weight load, and after release + sync it generates bitwise what an engine that never released does."""

from __future__ import annotations

import pytest
import torch

from engines.base import EngineReleased, GenerateRequest, SamplingParams
from engines.torch_engine.engine import TorchEngine


def _storage_bytes(engine: TorchEngine) -> int:
    """Bytes of parameter storage the engine's model holds (a tied weight once)."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in engine.model.parameters()
    }
    return sum(storages.values())


def _requests() -> list[GenerateRequest]:
    return [
        GenerateRequest((2, 7, 11, 14, 8, 7, 16, 3), seed=s, params=SamplingParams(max_new_tokens=12))
        for s in range(6)
    ]


def test_release_frees_the_weights_and_a_full_sync_brings_them_back_bitwise(base_checkpoint):
    kept, offloaded = TorchEngine(base_checkpoint), TorchEngine(base_checkpoint)
    # trained weights stand-in: another version than the checkpoint's, sent to both as a sync would
    synced = {
        k: v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
        for k, v in kept.get_weights().items()
    }
    kept.update_weights(synced, version=1)
    expected = kept.generate(_requests())

    offloaded.generate(_requests())  # builds the fast decoder's fused copies, which must go too
    held, sha = _storage_bytes(offloaded), offloaded.weights_sha256()
    offloaded.release_memory()
    assert held > 0 and _storage_bytes(offloaded) == 0 and offloaded._fast is None
    assert offloaded.released and offloaded.health()["released"]
    assert offloaded.weights_sha256() == sha  # the identity of what it released

    offloaded.resume_memory()
    assert _storage_bytes(offloaded) == held
    offloaded.update_weights(synced, version=1)
    assert not offloaded.released and offloaded.weights_sha256() == kept.weights_sha256()
    got = offloaded.generate(_requests())
    assert [o.response_tokens for o in got] == [o.response_tokens for o in expected]
    assert [o.log_probs for o in got] == [o.log_probs for o in expected]  # bitwise, not within a tolerance


def test_a_released_engine_refuses_work_until_every_weight_is_loaded(base_checkpoint):
    engine = TorchEngine(base_checkpoint)
    weights = engine.get_weights()
    engine.release_memory()
    with pytest.raises(
        EngineReleased, match=r"asked to generate but its weights are released \(--offload-rollout\)"
    ):
        engine.generate(_requests())
    engine.resume_memory()  # storage back, contents not: still refused
    with pytest.raises(EngineReleased, match="weight sync"):
        engine.generate(_requests())
    names = sorted(weights)
    engine.load_weights({n: weights[n] for n in names[1:]})  # a partial load (a streamed sync cut short)
    with pytest.raises(EngineReleased, match=f"1 of {len(names)} weights not loaded back.*{names[0]}"):
        engine.generate(_requests())
    with pytest.raises(EngineReleased, match="read weights"):
        engine.get_weights([names[0]])
    assert torch.equal(engine.get_weights([names[1]])[names[1]], weights[names[1]])  # a loaded one reads
    engine.load_weights({names[0]: weights[names[0]]})
    assert len(engine.generate(_requests())) == 6


def test_offload_rollout_flags_are_checked_and_named_as_slime(base_checkpoint):
    from config import RunConfig
    from config.slime_compat import FLAGS, refusal

    with pytest.raises(ValueError, match="--offload-rollout .* --debug-skip-weight-update"):
        RunConfig.model_validate(
            {
                "hf_checkpoint": base_checkpoint,
                "placement": {"offload_rollout": True},
                "debug": {"debug_skip_weight_update": True},
            }
        )
    assert FLAGS["--offload-rollout"][0] == "same"
    assert "give --offload-rollout" in (refusal("--offload") or "")
