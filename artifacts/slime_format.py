"""slime / miles rollout dumps (``.pt``) next to our Parquet rollouts: read, write, convert.

The anchors' ``--save-debug-rollout-data`` writes ``torch.save({"rollout_id": id, "metadata": {...},
"samples": [sample_dict, ...]})`` where each ``sample_dict`` is slime's ``Sample.to_dict()``
(reference: debug-features.md §1.4, §9.1). rollflow keeps rollouts as Parquet (DESIGN §3); this
module is the bridge, so a slime user can replay a dump with rollflow and hand rollflow's
recordings to slime.

Mapping (ours <-> slime sample dict):

- ``tokens`` = ``prompt_tokens + response_tokens``; the response is the LAST ``response_length``
  tokens, as in slime. ``index`` = ``sample_index``. ``status`` is the status string.
- ``weight_versions`` = ``[str(weight_version)]`` (slime keeps one entry per generation call).
- Empty ``rollout_log_probs`` (unknown) <-> ``None``, slime's "unknown".
- The sample-level ``rollout_id`` is written as ``None``: in slime it is a compact-rollout group id
  that its DP scheduler groups by, not the rollout iteration (§7 warns against overwriting it).
- What slime has no field for (our ``rollout_id``, ``seed``, and the prompt length as a check)
  goes into the sample's metadata under ``ROLLFLOW_KEY``; the loader pops it again, so a
  Parquet -> ``.pt`` -> Parquet round trip is lossless.

Loading a dump slime wrote is lossy where the schemas differ; every loss is recorded in the
sample's metadata (``slime_status``, ``slime_reward``, ``slime_weight_versions``, ``slime_extra``,
``slime_dropped_keys``, ``seed_unknown``, ...; see ``load_slime_dump``).

Security: ``.pt`` files are pickles. They are read with ``torch.load(weights_only=True)``, which
cannot run code; a dump that needs more (slime ``Sample`` objects, numpy arrays) is refused
unless the caller passes ``trust_pickle=True`` (the CLI's ``--trust-pickle``).
"""

from __future__ import annotations

import enum
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

from artifacts.atomic import atomic_path
from artifacts.schema import SAMPLE_STATUSES, Sample
from artifacts.store import (
    _RESERVED_KEYS,
    DEFAULT_LIMITS,
    ReadLimits,
    read_metadata,
    read_rollout,
    write_rollout,
)

__all__ = [
    "ROLLFLOW_KEY",
    "SlimeFormatError",
    "convert",
    "load_slime_dump",
    "read_any",
    "save_slime_dump",
    "write_any",
]

PathArg = str | os.PathLike[str]

# Key in a slime sample's metadata holding the rollflow fields slime has no slot for.
ROLLFLOW_KEY = "rollflow"

EVAL_PREFIX = "eval_"  # the anchors format eval dump paths with rollout_id="eval_<id>"

# Sample-dict keys the loader maps to our columns; any other key is an "extra" (see loader).
# The sample-level "rollout_id" is deliberately not here: it is slime's compact-rollout id, kept
# as an extra when set; our rollout id comes from the payload (or our own metadata block).
_KNOWN_KEYS = frozenset(
    {
        "group_index",
        "index",
        "prompt",
        "tokens",
        "response",
        "response_length",
        "label",
        "reward",
        "loss_mask",
        "rollout_log_probs",
        "status",
        "metadata",
        "weight_versions",
        "remove_sample",
    }
)

_SUFFIXES = (".parquet", ".pt")


class SlimeFormatError(ValueError):
    """A ``.pt`` rollout dump is unreadable, refused (needs arbitrary unpickling), or does not map
    onto our ``Sample`` schema. The message names the file and, where it applies, the sample."""


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _sample_to_slime(sample: Sample) -> dict[str, Any]:
    if ROLLFLOW_KEY in sample.metadata:
        raise ValueError(
            f"metadata key {ROLLFLOW_KEY!r} is reserved for the slime dump format (it would be lost)"
        )
    block = {
        "rollout_id": sample.rollout_id,
        "seed": sample.seed,
        "prompt_length": len(sample.prompt_tokens),
    }
    return {
        "group_index": sample.group_index,
        "index": sample.sample_index,
        "rollout_id": None,
        "prompt": sample.prompt,
        "tokens": [*sample.prompt_tokens, *sample.response_tokens],
        "response": sample.response,
        "response_length": sample.response_length,
        "label": sample.label,
        "reward": sample.reward,
        "loss_mask": list(sample.loss_mask),
        "rollout_log_probs": list(sample.rollout_log_probs) if sample.rollout_log_probs else None,
        "status": sample.status,
        "metadata": {**sample.metadata, ROLLFLOW_KEY: block},
        "weight_versions": [str(sample.weight_version)],
    }


def save_slime_dump(
    path: PathArg, rollout_id: int | str, samples: list[Sample], metadata: dict[str, Any] | None = None
) -> None:
    """Write ``samples`` as a slime/miles rollout dump at ``path``, atomically.

    The payload is ``{"rollout_id": rollout_id, "metadata": metadata or {}, "samples": [...]}``
    (miles' layout; slime's loader ignores ``metadata``) holding only dicts, lists, str, int,
    float, bool and None, so ``torch.load(path, weights_only=True)`` reads it. Every sample is
    validated first; ``ValueError`` names the first invalid one, and nothing is written. A
    sample whose metadata already holds ``ROLLFLOW_KEY`` is refused (it could not round-trip).
    """
    import torch  # lazy: reading Parquet through this module should not pay torch's import

    dicts = []
    for position, sample in enumerate(samples):
        try:
            sample.validate()
            dicts.append(_sample_to_slime(sample))
        except ValueError as e:
            raise ValueError(
                f"save_slime_dump({os.fspath(path)}): sample {position} "
                f"(sample_index={sample.sample_index!r}): {e}"
            ) from e
    payload = {"rollout_id": rollout_id, "metadata": dict(metadata or {}), "samples": dicts}
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _torch_load(path: Path, trust_pickle: bool) -> Any:
    import torch

    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        return torch.load(path, weights_only=not trust_pickle, map_location="cpu")
    except pickle.UnpicklingError as e:
        if trust_pickle:
            raise SlimeFormatError(f"{path}: not a readable torch.save file: {e}") from e
        # torch words both refusals ("Unsupported global: GLOBAL mod.Class") and garbage
        # ("Unsupported operand") as "Weights only load failed"; name the class when it is one.
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"pickled objects of class {found.group(1)}" if found else "data torch cannot read safely"
        raise SlimeFormatError(
            f"{path}: the dump holds {what}, which torch.load(weights_only=True) refuses "
            "(or the file is corrupt). Pass --trust-pickle (trust_pickle=True) to allow arbitrary "
            "unpickling; this runs code from the file, so only do it for dumps you trust."
        ) from e
    except ModuleNotFoundError as e:  # only reachable with trust_pickle: a class of an absent package
        raise SlimeFormatError(
            f"{path}: the dump pickles objects from module {e.name!r}, which is not installed here; "
            "install it (e.g. slime) or re-save the dump as plain dicts (Sample.to_dict())"
        ) from e
    except (RuntimeError, EOFError, OSError, AttributeError) as e:
        raise SlimeFormatError(f"{path}: not a readable torch.save file (truncated or corrupt?): {e}") from e


def _as_dict(item: Any) -> dict[str, Any] | None:
    """A sample dict from a dict, or (trusted dumps) a slime ``Sample`` object."""
    if isinstance(item, dict):
        return item
    if hasattr(item, "to_dict"):
        converted = item.to_dict()
        return converted if isinstance(converted, dict) else None
    if hasattr(item, "__dict__"):
        return dict(vars(item))
    return None


def _json_value(value: Any) -> bool:
    """Whether ``value`` survives our metadata column (JSON text) unchanged."""
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def _int_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if hasattr(value, "tolist"):  # tensors / ndarrays in trusted dumps
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            if hasattr(v, "item") and isinstance(v.item(), int):  # numpy / torch integer scalars
                v = v.item()
            else:
                raise ValueError(f"{name} must hold ints, got {type(v).__name__}")
        out.append(v)
    return out


def _float_list(value: Any, name: str) -> list[float]:
    if value is None:
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of floats, got {type(value).__name__}")
    return [float(v) for v in value]


def _mask_list(value: Any) -> list[int]:
    # Unlike token ids, masks may arrive as bools (or bool tensors); 0/1 in any numeric form is
    # accepted, anything else refused rather than rounded.
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"loss_mask must be a list, got {type(value).__name__}")
    bad = [m for m in value if not (m == 0 or m == 1)]
    if bad:
        raise ValueError(f"loss_mask values must be 0 or 1, got {bad[:5]}")
    return [1 if m == 1 else 0 for m in value]


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "item"):  # 0-d tensor / numpy scalar; .item() refuses anything bigger
        try:
            item = value.item()
        except (RuntimeError, ValueError):
            return None
        return float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else None
    return None


def _text(value: Any, name: str, notes: dict[str, Any]) -> str:
    """Our str columns: None -> "", str as is, chat-message lists etc. as JSON text (noted)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not _json_value(value):
        raise ValueError(f"{name} is a {type(value).__name__} that is neither str nor JSON-serialisable")
    notes[f"slime_{name}_is_json"] = True
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _rollout_id_from_payload(payload_id: Any) -> int | None:
    if isinstance(payload_id, int) and not isinstance(payload_id, bool):
        return payload_id
    if isinstance(payload_id, str):
        found = re.fullmatch(rf"(?:{EVAL_PREFIX})?(\d+)", payload_id)
        if found:
            return int(found.group(1))
    return None


def _slime_to_sample(d: dict[str, Any], payload_rollout_id: Any, reward_key: Any, position: int) -> Sample:
    """One slime sample dict -> our ``Sample`` (validated); ``ValueError`` names the problem."""
    notes: dict[str, Any] = {}  # loader annotations, merged into the metadata at the end
    metadata = d.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}")
    metadata = dict(metadata)
    block = metadata.pop(ROLLFLOW_KEY, None)
    block = block if isinstance(block, dict) else {}

    tokens = _int_list(d.get("tokens"), "tokens")
    response_length = d.get("response_length", 0)
    if isinstance(response_length, bool) or not isinstance(response_length, int):
        raise ValueError(f"response_length must be an int, got {response_length!r}")
    if not 0 <= response_length <= len(tokens):
        raise ValueError(f"response_length {response_length} is outside [0, len(tokens)={len(tokens)}]")
    split = len(tokens) - response_length
    prompt_tokens, response_tokens = tokens[:split], tokens[split:]
    if "prompt_length" in block and block["prompt_length"] != len(prompt_tokens):
        raise ValueError(
            f"metadata[{ROLLFLOW_KEY!r}] records {block['prompt_length']} prompt tokens but tokens and "
            f"response_length give {len(prompt_tokens)} (tokens or response_length edited?)"
        )

    if "rollout_id" in block:
        rollout_id = block["rollout_id"]
    else:
        rollout_id = _rollout_id_from_payload(payload_rollout_id)
        if rollout_id is None:
            raise ValueError(f"the dump's rollout_id {payload_rollout_id!r} is not an int or 'eval_<int>'")

    if "seed" in block:
        seed = block["seed"]
    else:  # slime records no per-sample seed; -1 is outside the seeds our engines derive (>= 0)
        seed = -1
        notes["seed_unknown"] = True

    index = d.get("index")
    if index is None:
        index = position
        notes["slime_index_missing"] = True
    group_index = d.get("group_index")
    if group_index is None:  # each sample its own group, as slime treats samples without one
        group_index = index
        notes["slime_group_index_missing"] = True

    raw_reward = d.get("reward")
    reward = _number(raw_reward)
    if reward is None:
        if isinstance(raw_reward, dict):
            if reward_key is None:
                raise ValueError(
                    f"reward is a dict with keys {sorted(raw_reward)} and the dump names no reward_key "
                    "(metadata['reward_key']) to pick one"
                )
            picked = _number(raw_reward.get(reward_key))
            if picked is None:
                raise ValueError(f"reward dict has no number under reward_key {reward_key!r}: {raw_reward}")
            reward = picked
            notes["slime_reward"] = raw_reward if _json_value(raw_reward) else str(raw_reward)
        else:  # slime itself cannot train on it either (get_reward_value -> None)
            raise ValueError(f"reward must be a number or a dict, got {raw_reward!r}")

    status = d.get("status")
    if isinstance(status, enum.Enum):  # slime's Status in trusted dumps of Sample objects
        status = status.value
    if status is None:
        raise ValueError("no status (slime's Sample.from_dict requires one too)")
    if status not in SAMPLE_STATUSES:  # e.g. "pending": we have no such state
        notes["slime_status"] = str(status)
        status = "failed"

    raw_mask = d.get("loss_mask")
    loss_mask = [1] * response_length if raw_mask is None else _mask_list(raw_mask)
    if d.get("remove_sample"):  # slime zeroes the loss mask of removed samples when building the batch
        loss_mask = [0] * len(loss_mask)
        notes["slime_remove_sample"] = True

    versions = d.get("weight_versions") or []
    versions = [str(v) for v in versions]
    if len(versions) == 1 and re.fullmatch(r"-?\d+", versions[0]):
        weight_version = int(versions[0])
    else:  # none, several generation calls, or non-numeric: keep the latest numeric, note all
        numeric = [int(v) for v in versions if re.fullmatch(r"-?\d+", v)]
        weight_version = numeric[-1] if numeric else -1
        notes["slime_weight_versions"] = versions

    extra: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in d.items():
        if key in _KNOWN_KEYS or value is None:  # None: slime's default for every optional field
            continue
        if isinstance(key, str) and _json_value(value):
            extra[key] = value
        else:
            dropped.append(str(key))
    if extra:
        notes["slime_extra"] = extra
    if dropped:
        notes["slime_dropped_keys"] = sorted(dropped)
    prompt = _text(d.get("prompt"), "prompt", notes)
    response = _text(d.get("response"), "response", notes)
    label = _text(d.get("label"), "label", notes)

    for key, value in notes.items():
        if key in metadata:
            raise ValueError(f"metadata already has key {key!r}, which the loader needs for its own note")
        metadata[key] = value

    sample = Sample(
        rollout_id=rollout_id,
        group_index=group_index,
        sample_index=index,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        response=response,
        response_tokens=response_tokens,
        response_length=response_length,
        label=label,
        reward=reward,
        status=status,
        loss_mask=loss_mask,
        rollout_log_probs=_float_list(d.get("rollout_log_probs"), "rollout_log_probs"),
        weight_version=weight_version,
        seed=seed,
        metadata=metadata,
    )
    sample.validate()
    return sample


def load_slime_dump(
    path: PathArg, *, trust_pickle: bool = False
) -> tuple[int | str, dict[str, Any], list[Sample]]:
    """Read a slime/miles rollout dump: ``(rollout_id, metadata, samples)``.

    ``rollout_id`` and ``metadata`` are the payload's (``metadata`` is ``{}`` when absent, as in
    slime dumps). Reads with ``torch.load(weights_only=True)``; a dump that needs arbitrary
    unpickling raises ``SlimeFormatError`` telling to pass ``--trust-pickle``; with
    ``trust_pickle=True`` it is loaded with ``weights_only=False`` (runs code from the file) and
    sample objects are accepted (``to_dict()`` or ``__dict__``). A missing file raises
    ``FileNotFoundError``.

    Per sample: the response is the last ``response_length`` tokens; missing ``loss_mask`` ->
    all ones (zeros when ``remove_sample``); missing ``rollout_log_probs`` -> ``[]``; a dict
    reward takes ``metadata["reward_key"]`` (payload metadata, else the sample's) or fails; a
    status we lack ("pending") -> "failed"; ``seed`` -> -1 unless recorded by
    ``save_slime_dump``. Every such loss is noted in the sample's metadata: ``slime_status``,
    ``slime_reward`` (the dict), ``slime_weight_versions`` (unless exactly one numeric entry),
    ``seed_unknown``, ``slime_remove_sample``, ``slime_index_missing`` /
    ``slime_group_index_missing`` (then position / own group), ``slime_<field>_is_json``
    (chat-message prompts as JSON text). Unknown non-None keys go to ``slime_extra`` when
    JSON-serialisable, else their names to ``slime_dropped_keys`` (tensors such as routed
    experts). Any sample that does not map raises ``SlimeFormatError`` naming the file and sample.
    """
    path = Path(os.fspath(path))
    payload = _torch_load(path, trust_pickle)
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        raise SlimeFormatError(
            f"{path}: not a rollout dump: expected a dict with a 'samples' list, got "
            f"{type(payload).__name__}"
            + (f" with keys {sorted(map(str, payload))}" if isinstance(payload, dict) else "")
        )
    if "rollout_id" not in payload:
        raise SlimeFormatError(f"{path}: the dump has no 'rollout_id'")
    rollout_id = payload["rollout_id"]
    metadata = payload.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SlimeFormatError(f"{path}: 'metadata' must be a dict, got {type(metadata).__name__}")

    samples = []
    for position, item in enumerate(payload["samples"]):
        d = _as_dict(item)
        if d is None:
            raise SlimeFormatError(f"{path}: sample {position} is a {type(item).__name__}, not a sample dict")
        sample_meta = d.get("metadata")
        reward_key = metadata.get("reward_key")
        if reward_key is None and isinstance(sample_meta, dict):
            reward_key = sample_meta.get("reward_key")
        try:
            samples.append(_slime_to_sample(d, rollout_id, reward_key, position))
        except (ValueError, TypeError) as e:  # TypeError: e.g. None inside a list of floats
            raise SlimeFormatError(f"{path}: sample {position} (index={d.get('index')!r}): {e}") from e
    return rollout_id, metadata, samples


# --------------------------------------------------------------------------------------------
# Either format, by extension
# --------------------------------------------------------------------------------------------


def _suffix(path: PathArg) -> str:
    suffix = Path(os.fspath(path)).suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(
            f"{os.fspath(path)}: unsupported rollout file extension {suffix or '(none)'!r}; "
            f"use .parquet (rollflow) or .pt (slime/miles dump)"
        )
    return suffix


def read_any(
    path: PathArg, *, trust_pickle: bool = False, limits: ReadLimits = DEFAULT_LIMITS
) -> list[Sample]:
    """Samples of a rollout file: ``.parquet`` via ``read_rollout`` (within ``limits``), ``.pt`` via
    ``load_slime_dump``; any other extension raises ``ValueError`` naming it and the two supported ones."""
    if _suffix(path) == ".parquet":
        return read_rollout(path, limits=limits)
    return load_slime_dump(path, trust_pickle=trust_pickle)[2]


def write_any(
    path: PathArg, rollout_id: int | str, samples: list[Sample], metadata: dict[str, Any] | None = None
) -> None:
    """Write a rollout file in the format its extension names (see ``read_any``).

    ``.parquet``: ``write_rollout`` with ``metadata`` as file metadata; the samples carry their
    rollout id, and a ``rollout_id`` of the form ``"eval_<id>"`` writes kind "eval".
    ``.pt``: ``save_slime_dump``.
    """
    if _suffix(path) == ".parquet":
        kind = "eval" if isinstance(rollout_id, str) and rollout_id.startswith(EVAL_PREFIX) else "rollout"
        write_rollout(path, samples, metadata=metadata, kind=kind)
    else:
        save_slime_dump(path, rollout_id, samples, metadata)


def _read_parquet_with_header(path: PathArg) -> tuple[int | str, dict[str, Any], list[Sample]]:
    """Like ``load_slime_dump`` for Parquet: the payload-style rollout id and user metadata."""
    meta = read_metadata(path)
    kind = meta.get("kind")
    user_meta = {k: v for k, v in meta.items() if k not in _RESERVED_KEYS}
    samples = read_rollout(path)
    ids = sorted({s.rollout_id for s in samples})
    if len(ids) > 1:
        raise ValueError(f"{os.fspath(path)}: samples of several rollouts {ids}; a dump holds one rollout")
    rollout_id: int | str = ids[0] if ids else 0  # an empty rollout carries no id; 0 by convention
    if kind == "eval":
        rollout_id = f"{EVAL_PREFIX}{rollout_id}"
    return rollout_id, user_meta, samples


def convert(src: PathArg, dst: PathArg, *, trust_pickle: bool = False) -> int:
    """Convert a rollout file between ``.parquet`` and ``.pt`` (either direction, or same format);
    return the number of samples written.

    The rollout id and the file/payload metadata carry over: Parquet file metadata (minus
    rollflow's reserved keys) <-> the dump's ``metadata``; Parquet kind "eval" <-> a dump
    ``rollout_id`` of ``"eval_<id>"``. ``dst`` is written atomically.
    """
    _suffix(dst)  # fail before reading a large source
    if _suffix(src) == ".parquet":
        rollout_id, metadata, samples = _read_parquet_with_header(src)
    else:
        rollout_id, metadata, samples = load_slime_dump(src, trust_pickle=trust_pickle)
    write_any(dst, rollout_id, samples, metadata)
    return len(samples)
