"""An engine that cannot load its model is reported in one line naming the actor, the model file and the cause,
not as Ray's ActorDiedError with the remote traceback flattened into it."""

from __future__ import annotations

import asyncio
import shutil

import pytest


def test_engine_with_corrupt_weights_names_actor_file_and_cause(tmp_path, ray_session, base_checkpoint):
    from engines.actor import EngineActor
    from tasks.actors import ActorStartError, _answering

    model = tmp_path / "model"
    shutil.copytree(base_checkpoint, model)
    (model / "model.safetensors").write_bytes(b"\0" * 100)  # a header that is not JSON
    actor = EngineActor.options(num_cpus=0).remote("torch", str(model), 1, 0)
    try:
        with pytest.raises(ActorStartError) as caught:
            asyncio.run(_answering({"engine-0": actor}, [actor.health.remote()]))
    finally:
        ray_session.kill(actor)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith("engine-0 did not start: ModelLoadError: cannot load the model "), message
    assert f"{model / 'model.safetensors'}: SafetensorError: Error while deserializing header" in message, (
        message
    )
