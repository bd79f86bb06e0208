"""Typed run configuration: one frozen pydantic model per concern, a bottom package that imports no other
rollflow package (backend choices come from the registry tables in config/backends.py).

The same models are the flow's parameters (Prefect renders them as forms), the YAML file format
(`--config FILE.yaml`, nested by section) and the CLI flags (`flows/cli.py` derives one flag per field:
`rollout_batch_size` -> `--rollout-batch-size`, slime's names where one exists). Defaults live here and nowhere
else. They are the default run's (tiny-arith, GRPO): the batch shape, learning rate and schedule were chosen by
measurement with `bench/learning.py`.
"""

from config.base import Section
from config.debug import RECORDING_FORMATS, CIConfig, DebugConfig
from config.ops import FaultConfig, LoggingConfig, WandbMode
from config.placement import SLOT_RESOURCE, PlacementConfig
from config.plugins import LossConfig, SamplingConfig
from config.rollout import DataConfig, EvalConfig, RewardConfig, RolloutConfig
from config.run import SECTIONS, RunConfig, dump_yaml, load_yaml
from config.train import CheckpointConfig, TrainConfig

__all__ = [
    "RECORDING_FORMATS",
    "SECTIONS",
    "SLOT_RESOURCE",
    "CIConfig",
    "CheckpointConfig",
    "DataConfig",
    "DebugConfig",
    "EvalConfig",
    "FaultConfig",
    "LoggingConfig",
    "LossConfig",
    "PlacementConfig",
    "RewardConfig",
    "RolloutConfig",
    "SamplingConfig",
    "RunConfig",
    "Section",
    "TrainConfig",
    "WandbMode",
    "dump_yaml",
    "load_yaml",
]
