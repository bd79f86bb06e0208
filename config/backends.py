"""Backend registries as data: name -> "module:Class". The config's backend choices are these keys, and
engines/registry.py and trainers/registry.py import the named class only when it is asked for (so the CPU
suite never imports sglang or megatron). Deleting a backend = its folder + its line here."""

from __future__ import annotations

ENGINES: dict[str, str] = {
    "torch": "engines.torch_engine.engine:TorchEngine",
}

TRAINERS: dict[str, str] = {
    "torch": "trainers.torch_trainer.trainer:TorchTrainer",
    "megatron": "trainers.megatron.trainer:MegatronTrainer",
}
