"""slime's `args`: the run's whole config as one flat namespace under slime's attribute names
(`args.rollout_max_response_len`, `args.n_samples_per_prompt`, `args.rm_type`, `args.custom_rm_path`, ...). A
custom reward and every plug-in receive it as their first argument, as slime hands them its parsed flags.

Every field of every config section is an attribute: the sections' field names are slime's flag names, and no
two sections share one. So are the run-level fields (`hf_checkpoint`, `name`, ...), and what slime's own code
reads that rollflow always does the same way (`rollout_global_dataset`). The namespace is a copy: a plug-in
that sets an attribute changes nothing in the run.
"""

from __future__ import annotations

import copy
from argparse import Namespace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from config import RunConfig

# what slime's rollout code reads that has one meaning in rollflow: prompts come from the run's own data
# source (slime's global dataset), the default generate path stops at EOS and keeps the stop text
_FIXED: dict[str, Any] = {"rollout_global_dataset": True}


def config_fields(cfg: RunConfig) -> dict[str, Any]:
    """Every config field of `cfg` by its flag's attribute name, sections flattened (a field a section and the
    run share is refused: it would be ambiguous)."""
    out: dict[str, Any] = {}
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        items = (
            [(n, getattr(value, n)) for n in type(value).model_fields]
            if isinstance(value, BaseModel)
            else [(name, value)]
        )
        for key, v in items:
            if key in out:
                raise ValueError(f"config field {key!r} is defined twice: slime's args would be ambiguous")
            out[key] = v.model_dump() if isinstance(v, BaseModel) else v
    return out


def slime_args(cfg: RunConfig, **extra: Any) -> Namespace:
    """A fresh `args` for `cfg` (see the module docstring); `extra` adds or overrides attributes."""
    values = {**_FIXED, **copy.deepcopy(config_fields(cfg)), **extra}
    if values.get("run_dir") is None:
        values["run_dir"] = str(cfg.resolved_run_dir)
    return Namespace(**values)
