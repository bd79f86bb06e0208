"""The recipes' values for fields whose defaults are slime's (`slime/utils/arguments.py`, and Megatron's where slime
keeps Megatron's): a run on a recipe's own data gets the values it was tuned with (bench/learning.py), a run on
`--prompt-data` gets slime's defaults. Kept here, not in recipes/, so a config is validated with them: a
plain `rollflow run --rollout-batch-size 32` is checked against the recipe's group size, not slime's 1.
recipes/registry.py hands the same table to each Recipe."""

from __future__ import annotations

import math
from typing import Any

_ARITH: dict[str, dict[str, Any]] = {
    "rollout": {"n_samples_per_prompt": 4},
    "eval": {"eval_interval": 10, "n_samples_per_eval_prompt": 4},
    "train": {
        "lr": 2e-4,
        "lr_decay_style": "cosine",
        "kl_loss_type": "low_var_kl",
        "weight_decay": 0.0,
        "micro_batch_size": None,
        "global_batch_size": 128,
    },
}


# the vocabulary of the long-arith scale recipes (recipes/long_arith_scale/model.py VOCAB_SIZE)
SCALE_VOCAB_SIZE = 151_936


def _scale(max_tokens_per_gpu: int) -> dict[str, dict[str, Any]]:
    """The long-arith scale recipes (untrained models, run to measure cost): a few short rollouts of a few groups,
    one optimizer step per rollout over token-budget micro-batches, no eval, slime's learning rate, and bf16 where
    the CPU computes it (config/precision.py). Their --ci-test keeps every checker but expects an untrained model:
    it samples near-uniformly (entropy just under ln(vocabulary), the bound of any distribution over it, not
    miles' 0.7 for a trained one), earns no reward and never stops before the length limit, which the doctor
    reports without failing the run."""
    return {
        "rollout": {"num_rollout": 3, "rollout_batch_size": 8, "n_samples_per_prompt": 4},
        "train": {
            "micro_batch_size": None,  # with no global batch: the whole rollout is one optimizer step
            "use_dynamic_batch_size": True,
            "max_tokens_per_gpu": max_tokens_per_gpu,
            "precision": "auto",
        },
        "ci": {"ci_entropy_max": math.log(SCALE_VOCAB_SIZE), "ci_doctor": "advisory"},
    }


# recipe name -> section -> field -> value
RECIPE_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny-arith": _ARITH,
    "long-arith": _ARITH,
    # the token budget bounds a micro-batch's activations without activation checkpointing (they grow with the model)
    "long-arith-50m": _scale(max_tokens_per_gpu=2048),
    "long-arith-0.5b": _scale(max_tokens_per_gpu=1024),
}


def apply_preset(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a RunConfig's input mapping) with its recipe's preset filled in where no field was given, when the
    recipe supplies the prompts (no `data.prompt_data`). A section given as a model counts the fields it was
    built with as given."""
    recipe = data.get("recipe", "tiny-arith")
    preset = RECIPE_PRESETS.get(recipe) if isinstance(recipe, str) else None
    if preset is None or _given_prompt_data(data.get("data")):
        return data
    out = dict(data)
    for section, values in preset.items():
        held = out.get(section)
        if held is None:
            given: dict[str, Any] = {}
        elif isinstance(held, dict):
            given = held
        elif hasattr(held, "model_fields_set"):
            given = held.model_dump(include=held.model_fields_set)
        else:
            continue  # not a mapping: the section's own validation says so
        if given.get("num_steps_per_rollout") is not None:  # slime: the step count sets the global batch
            values = {k: v for k, v in values.items() if k != "global_batch_size"}
        out[section] = {**{k: v for k, v in values.items() if k not in given}, **given}
    return out


def _given_prompt_data(section: Any) -> bool:
    if isinstance(section, dict):
        return section.get("prompt_data") is not None
    return getattr(section, "prompt_data", None) is not None
