"""Checkpoint lint: is an HF safetensors checkpoint on disk complete and consistent with its config.json?

Reads only the safetensors headers (plus, for tied embeddings, the bytes of the two tied tensors) of an HF model
dir, so it is cheap on any size of model; a rollflow checkpoint's content is verified too (below). What it
checks, each problem naming the shard or tensor:

- every shard that ``model.safetensors.index.json`` lists exists, holds exactly the tensors listed for it
  (a tensor in the wrong shard, a tensor no shard holds, a tensor stored twice, a shard the index omits),
  and is not truncated (every tensor's bytes lie inside the file and match its shape and dtype);
- the tensors match ``config.json``: the dtype of unquantised floating tensors, the shapes of the
  standard decoder tensors (embeddings, attention, MLP, MoE experts and router, norms, lm_head), every
  layer ``0 .. num_hidden_layers - 1`` present and, in a dense model, holding the same tensors as the
  others; every MoE layer holds every expert;
- tied embeddings: ``lm_head.weight`` is present when ``tie_word_embeddings`` is false, and equal to the
  embedding when it is true and both are stored;
- a ``quantization_config``: the modules that must stay unquantised (lm_head, embeddings, norms, MoE
  router gates) are not stored quantised, the 2-D ones are listed in its ignore list
  (``ignore`` / ``modules_to_not_convert`` / ...), and no listed module is missing from the model.
  slime's debug guide shows why: an online quantiser that follows the list turns an unlisted router
  gate into packed INT4 tensors that SGLang skips by name, leaving the gate all zeros.

A directory is an HF model dir (``model.safetensors`` or an index), a rollflow ``--save`` dir (every
``iter_N`` checkpoint in it is linted; the ``iter_N.tmp-*`` dirs of saves that died are named, not linted) or
one ``iter_N`` dir. A rollflow checkpoint (a dir with ``meta.json``, or an ``iter_N`` dir beside
``latest_checkpointed_iteration.txt``) is also checked for every file a ``--load`` reads
(``artifacts.checkpoints.load_problems``: meta, optimizer, scheduler, RNG, a Megatron checkpoint's shards).
Its files are re-read and hashed against the content hashes its save recorded (``artifacts.content_hashes``),
each changed tensor named. A checkpoint saved before those hashes existed is listed as unverified.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifacts.checkpoints import LATEST_FILE, is_checkpoint_name, load_problems, unfinished_saves

__all__ = ["CheckpointNotFound", "LintProblem", "LintReport", "lint_checkpoint", "read_safetensors_header"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_CONFIG_DTYPES = {
    "float32": "F32",
    "float": "F32",
    "bfloat16": "BF16",
    "float16": "F16",
    "half": "F16",
    "float64": "F64",
    "double": "F64",
}
# Tensors that quantisation formats store next to (or instead of) a module's plain `weight`:
# compressed-tensors, GPTQ/AWQ, FP8 block scales, bitsandbytes.
_QUANT_SUFFIXES = {
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_global_scale",
    "input_global_scale",
    "input_scale",
    "weight_scale_inv",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "SCB",
    "absmax",
    "quant_map",
    "nested_absmax",
    "nested_quant_map",
}
_IGNORE_KEYS = ("ignore", "modules_to_not_convert", "ignored_layers", "llm_int8_skip_modules")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(.+)$")


class CheckpointNotFound(ValueError):
    """The path is not a checkpoint lint can read (no such path, or no safetensors model in it)."""


@dataclass(frozen=True)
class LintProblem:
    """One problem: `where` names the shard file or tensor (module) to look at, `message` what is wrong."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class LintReport:
    """What `lint_checkpoint` looked at and the problems it found (none = the checkpoint is consistent)."""

    dirs: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # iter_N.tmp-* dirs of saves that died, not linted
    unverified: list[str] = field(default_factory=list)  # rollflow checkpoints saved without content hashes
    files: int = 0
    tensors: int = 0
    problems: list[LintProblem] = field(default_factory=list)


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offsets in `file`
    end: int


def checkpoint_numel(checkpoint: Path) -> int:
    """The elements of every tensor an HF checkpoint dir's safetensors files hold (its parameters; a tied embedding
    stored once counts once), from their headers; ValueError naming a file whose header is unreadable, or the dir
    when it holds no safetensors weights."""
    total = 0
    for path in sorted(checkpoint.glob("*.safetensors")):
        tensors, problems = read_safetensors_header(path)
        if problems:
            raise ValueError(f"{path}: {'; '.join(problems)}")
        total += sum(math.prod(t.shape) for t in tensors.values())
    if not total:
        raise ValueError(f"{checkpoint}: no safetensors weights")
    return total


def read_safetensors_header(path: Path) -> tuple[dict[str, _Tensor], list[str]]:
    """The tensors a safetensors file declares (name -> dtype, shape, absolute byte range) and the problems
    of its layout: a header that cannot be read, a tensor whose bytes lie beyond the end of the file
    (truncated) or whose byte count does not match its shape and dtype. Reads the header only."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return {}, [f"not a safetensors file: {size} bytes"]
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return {}, [
                f"truncated: the header claims {n} bytes, the file has {size - 8} after its length field"
            ]
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            return {}, [f"unreadable safetensors header: {e}"]
    if not isinstance(header, dict):
        return {}, ["unreadable safetensors header: not a JSON object"]
    tensors, problems = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            t = _Tensor(
                name,
                str(info["dtype"]),
                tuple(int(d) for d in info["shape"]),
                path,
                8 + n + begin,
                8 + n + end,
            )
        except (KeyError, TypeError, ValueError):
            problems.append(f"tensor {name}: malformed header entry {info!r}")
            continue
        tensors[name] = t
        if t.end > size:
            problems.append(f"truncated: tensor {name}'s bytes end at {t.end}, the file has {size}")
        width = _DTYPE_BYTES.get(t.dtype)
        if width is not None and (t.end - t.start) != math.prod(t.shape) * width:
            problems.append(
                f"tensor {name}: {t.end - t.start} bytes stored for shape {list(t.shape)} {t.dtype} "
                f"({math.prod(t.shape) * width} needed)"
            )
    return tensors, problems


# -- which directories -------------------------------------------------------------------------------------
def _is_model_dir(d: Path) -> bool:
    return (d / INDEX_FILE).is_file() or (d / SINGLE_FILE).is_file()


def _is_rollflow_checkpoint(d: Path) -> bool:
    return (d / "meta.json").is_file() or (is_checkpoint_name(d) and (d.parent / LATEST_FILE).is_file())


def _model_dirs(path: Path) -> list[Path]:
    """The model dirs under `path`: itself, or every iter_N checkpoint of a rollflow --save dir."""
    if not path.exists():
        raise CheckpointNotFound(f"{path}: no such file or directory")
    if path.is_file():
        if path.name in (INDEX_FILE, SINGLE_FILE):
            return [path.parent]
        raise CheckpointNotFound(
            f"{path}: not a checkpoint (give the directory, {SINGLE_FILE} or {INDEX_FILE})"
        )
    if _is_model_dir(path) or _is_rollflow_checkpoint(path):
        return [path]
    iters = sorted(
        p
        for p in path.glob("iter_*")
        if p.is_dir() and is_checkpoint_name(p) and (_is_model_dir(p) or _is_rollflow_checkpoint(p))
    )
    if not iters:
        unfinished = unfinished_saves(path)
        stale = (
            f" ({len(unfinished)} unfinished save(s) only: {unfinished[0].name}, ...)" if unfinished else ""
        )
        raise CheckpointNotFound(
            f"{path}: not a checkpoint: no {SINGLE_FILE}, no {INDEX_FILE}, no iter_* checkpoints{stale}"
        )
    return iters


def lint_checkpoint(path: str | Path, verify_content: bool = True) -> LintReport:
    """Lint the checkpoint(s) at `path` (see the module docstring); `verify_content` also re-hashes the tensors
    of a rollflow checkpoint against its content hashes (`artifacts.content_hashes`). Raises `CheckpointNotFound`
    when `path` holds no checkpoint; every other problem is reported, none raised."""
    root = Path(path)
    report = LintReport()
    for d in _model_dirs(root):
        prefix = "" if d == root or d == root.parent else f"{d.name}/"
        _lint_dir(d, prefix, report)
        if verify_content and _is_rollflow_checkpoint(d):
            _verify_content(d, prefix, report)
    if root.is_dir():
        report.unfinished = [p.name for p in unfinished_saves(root)]
    return report


def _lint_dir(d: Path, prefix: str, report: LintReport) -> None:
    report.dirs.append(str(d))
    problems: list[LintProblem] = []
    model = _is_model_dir(d)
    if _is_rollflow_checkpoint(d):
        # with the weights present, the inventory below judges model.safetensors in its own words
        problems += [LintProblem(n, m) for n, m in load_problems(d) if not (model and n == SINGLE_FILE)]
    if not model:
        if not any(p.where == SINGLE_FILE for p in problems):
            problems.append(LintProblem(SINGLE_FILE, "missing: the HF weights cannot be checked"))
        report.problems += [LintProblem(prefix + p.where, p.message) for p in problems]
        return
    tensors, declared = _inventory(d, problems)
    config = _read_config(d, problems)
    if config is not None:
        problems += _check_config(config, tensors, declared)
        problems += _check_tied(config, tensors)
        problems += _check_quantization(config, tensors)
    report.files += len({t.file for t in tensors.values()})
    report.tensors += len(tensors)
    report.problems += [LintProblem(prefix + p.where, p.message) for p in problems]


def _verify_content(d: Path, prefix: str, report: LintReport) -> None:
    """The tensors whose bytes differ from their saved hashes, in files with no problem named already."""
    from artifacts import content_hashes  # torch, only for a checkpoint of ours

    named = {p.where for p in report.problems}
    found = content_hashes.verify(d)
    if found is None:
        report.unverified.append(str(d))
        return
    report.problems += [LintProblem(prefix + f, m) for f, m in found if prefix + f not in named]


def _read_config(d: Path, problems: list[LintProblem]) -> dict[str, Any] | None:
    path = d / "config.json"
    if not path.is_file():
        problems.append(
            LintProblem("config.json", "missing: shapes, dtypes and tied embeddings cannot be checked")
        )
        return None
    try:
        config = json.loads(path.read_text())
    except ValueError as e:
        problems.append(LintProblem("config.json", f"not valid JSON: {e}"))
        return None
    if not isinstance(config, dict):
        problems.append(LintProblem("config.json", "not a JSON object"))
        return None
    return config


# -- files and index ---------------------------------------------------------------------------------------
def _layers_of(names: list[str]) -> str:
    found = sorted({int(m.group(1)) for n in names if (m := _LAYER.search(n))})
    return (
        f" in layer(s) {', '.join(map(str, found[:12]))}{', ...' if len(found) > 12 else ''}" if found else ""
    )


def _inventory(d: Path, problems: list[LintProblem]) -> tuple[dict[str, _Tensor], set[str]]:
    """(every tensor stored in the model's safetensors file(s), every tensor name stored or listed in the
    index), checking the index against the shards. The layer checks use the declared names, so a missing
    shard is reported once, as a shard, not again as each tensor it held."""
    index = d / INDEX_FILE
    if not index.is_file():
        tensors, bad = read_safetensors_header(d / SINGLE_FILE)
        problems += [LintProblem(SINGLE_FILE, m) for m in bad]
        return tensors, set(tensors)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as e:
        problems.append(LintProblem(INDEX_FILE, f"unreadable index ({e})"))
        return {}, set()
    listed: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        listed.setdefault(str(shard), []).append(name)
    stored: dict[str, dict[str, _Tensor]] = {}
    for shard in sorted(listed):
        if not (d / shard).is_file():
            names = sorted(listed[shard])
            problems.append(
                LintProblem(
                    shard,
                    f"missing: {INDEX_FILE} lists it for {len(names)} tensor(s)"
                    f"{_layers_of(names)}, e.g. {names[0]}",
                )
            )
            continue
        stored[shard], bad = read_safetensors_header(d / shard)
        problems += [LintProblem(shard, m) for m in bad]
    for extra in sorted(p.name for p in d.glob("model*.safetensors") if p.name not in listed):
        problems.append(
            LintProblem(extra, f"not listed in {INDEX_FILE}: loaders that follow the index never read it")
        )
    tensors = _reconcile(weight_map, listed, stored, problems)
    return tensors, set(tensors) | set(weight_map)


def _reconcile(
    weight_map: dict[str, str],
    listed: dict[str, list[str]],
    stored: dict[str, dict[str, _Tensor]],
    problems: list[LintProblem],
) -> dict[str, _Tensor]:
    """Tensors as the shards hold them; each disagreement with the index is a problem naming the tensor."""
    holders: dict[str, list[str]] = {}
    for shard, tensors in stored.items():
        for name in tensors:
            holders.setdefault(name, []).append(shard)
    for name, shards in sorted(holders.items()):
        if len(shards) > 1:
            problems.append(LintProblem(name, f"stored in {len(shards)} shards: {', '.join(sorted(shards))}"))
        if name not in weight_map:
            problems.append(LintProblem(name, f"stored in {shards[0]} but not listed in {INDEX_FILE}"))
    for shard in sorted(stored):
        for name in sorted(listed[shard]):
            if name in stored[shard]:
                continue
            where = holders.get(name)
            if where:
                message = f"in the wrong shard: {INDEX_FILE} lists it in {shard}, it is stored in {', '.join(where)}"
            else:
                message = f"listed in {shard} by {INDEX_FILE}, but no shard holds it"
            problems.append(LintProblem(name, message))
    return {name: stored[shards[0]][name] for name, shards in holders.items()}


# -- config.json: dtypes, shapes, layers -------------------------------------------------------------------
def _module(name: str) -> str:
    """The module a tensor belongs to: `lm_head` for `lm_head.weight_packed`, `x.q_proj` for `x.q_proj.weight`
    (bitsandbytes' `x.weight.absmax` belongs to `x` too)."""
    if ".weight." in name:
        return name.split(".weight.")[0]
    return name.rsplit(".", 1)[0] if "." in name else name


def _quantized_modules(tensors: dict[str, _Tensor]) -> dict[str, str]:
    """{module: the tensor that shows it is stored quantised} (a quantisation tensor, or an integer / float8
    `weight`)."""
    out: dict[str, str] = {}
    for name, t in sorted(tensors.items()):
        last = name.rsplit(".", 1)[-1]
        if last in _QUANT_SUFFIXES or (last == "weight" and t.dtype not in _FLOAT_DTYPES):
            out.setdefault(_module(name), f"{name} {t.dtype}")
    return out


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _shape_rules(config: dict[str, Any]) -> list[tuple[re.Pattern[str], tuple[int, ...]]]:
    """(tensor-name pattern, expected shape) for the standard HF decoder tensors whose sizes config.json gives."""
    v, h = _int(config, "vocab_size"), _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    kv = _int(config, "num_key_value_heads") or heads
    hd = _int(config, "head_dim") or (h // heads if h and heads else None)
    inter, moe = _int(config, "intermediate_size"), _int(config, "moe_intermediate_size")
    experts = _int(config, "num_experts", "num_local_experts", "n_routed_experts")
    q, k = (heads * hd if heads and hd else None), (kv * hd if kv and hd else None)
    rules: list[tuple[str, tuple[int | None, ...]]] = [
        (r"(^|\.)embed_tokens\.weight$", (v, h)),
        (r"^lm_head\.weight$", (v, h)),
        (
            r"\.(input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|post_feedforward_layernorm)\.weight$",
            (h,),
        ),
        (r"^model\.norm\.weight$", (h,)),
        (r"\.self_attn\.q_proj\.weight$", (q, h)),
        (r"\.self_attn\.q_proj\.bias$", (q,)),
        (r"\.self_attn\.[kv]_proj\.weight$", (k, h)),
        (r"\.self_attn\.[kv]_proj\.bias$", (k,)),
        (r"\.self_attn\.o_proj\.weight$", (h, q)),
        (r"\.self_attn\.[qk]_norm\.weight$", (hd,)),
        (r"\.mlp\.(gate_proj|up_proj)\.weight$", (inter, h)),
        (r"\.mlp\.down_proj\.weight$", (h, inter)),
        (r"\.mlp\.experts\.\d+\.(gate_proj|up_proj)\.weight$", (moe, h)),
        (r"\.mlp\.experts\.\d+\.down_proj\.weight$", (h, moe)),
        (r"\.mlp\.gate\.weight$", (experts, h)),
    ]
    return [
        (re.compile(p), tuple(int(x) for x in shape))  # type: ignore[arg-type]
        for p, shape in rules
        if all(x is not None for x in shape)
    ]


def _config_dtype(config: dict[str, Any]) -> str | None:
    value = config.get("torch_dtype") or config.get("dtype")
    return _CONFIG_DTYPES.get(str(value).removeprefix("torch.")) if value else None


def _check_config(
    config: dict[str, Any], tensors: dict[str, _Tensor], declared: set[str]
) -> list[LintProblem]:
    """dtypes and shapes (of the stored tensors) against config.json, then the layers (of the declared ones)."""
    problems = []
    quantized = _quantized_modules(tensors)
    dtype, rules = _config_dtype(config), _shape_rules(config)
    for name, t in sorted(tensors.items()):
        if _module(name) in quantized or name.rsplit(".", 1)[-1] in _QUANT_SUFFIXES:
            continue  # a quantised module's tensors have packed shapes and integer / scale dtypes by design
        if dtype is not None and t.dtype in _FLOAT_DTYPES and t.dtype != dtype:
            problems.append(
                LintProblem(
                    name,
                    f"dtype {t.dtype}, config.json says {dtype} "
                    f"({config.get('torch_dtype') or config.get('dtype')})",
                )
            )
        expected = next((shape for pattern, shape in rules if pattern.search(name)), None)
        if expected is not None and t.shape != expected:
            problems.append(LintProblem(name, f"shape {list(t.shape)}, config.json implies {list(expected)}"))
    return problems + _check_layers(config, declared)


def _check_layers(config: dict[str, Any], names: set[str]) -> list[LintProblem]:
    """Every layer 0 .. num_hidden_layers - 1 (+ MTP layers) holds tensors; in a dense model every layer holds
    the same ones; in an MoE layer every expert is complete."""
    layers: dict[int, set[str]] = {}
    for name in names:
        m = _LAYER.search(name)
        if m:
            layers.setdefault(int(m.group(1)), set()).add(name[m.end() :])
    n = _int(config, "num_hidden_layers")
    if not layers or n is None:
        return []
    extra = (
        _int(config, "num_nextn_predict_layers") or 0
    )  # DeepSeek-style MTP layers follow the decoder layers
    problems = [
        LintProblem(
            f"layer {i}",
            f"no tensors (num_hidden_layers is {n}): a missing shard or an unfinished conversion?",
        )
        for i in range(n)
        if i not in layers
    ]
    problems += [
        LintProblem(f"layer {i}", f"has tensors but num_hidden_layers is {n}")
        for i in sorted(layers)
        if i >= n + extra
    ]
    experts = _int(config, "num_experts", "num_local_experts", "n_routed_experts")
    kinds = set(config.get("layer_types") or [])
    # Only dense decoders whose layers are all alike: MoE models mix dense and sparse layers (DeepSeek's first
    # k), hybrid ones mix attention kinds, so "the same tensors as the others" does not hold there.
    if experts is None and len(kinds - {"full_attention", "sliding_attention"}) == 0 and len(layers) >= 3:
        problems += _uniform_layers(layers, n)
    if experts is not None:
        problems += _complete_experts(names, experts)
    return problems


def _uniform_layers(layers: dict[int, set[str]], n: int) -> list[LintProblem]:
    """Name each tensor that most layers hold and some layer lacks (and the reverse)."""
    typical_set, _ = Counter(frozenset(s) for i, s in layers.items() if i < n).most_common(1)[0]
    problems = []
    for i, names in sorted(layers.items()):
        if i >= n:
            continue
        problems += [
            LintProblem(f"model.layers.{i}.{s}", "missing: the other layers hold it")
            for s in sorted(typical_set - names)
        ]
        problems += [
            LintProblem(f"model.layers.{i}.{s}", "only this layer holds it")
            for s in sorted(names - typical_set)
        ]
    return problems


def _complete_experts(names: set[str], experts: int) -> list[LintProblem]:
    """In every layer that has experts: experts 0 .. experts - 1, each with the tensors the others have."""
    by_layer: dict[int, dict[int, set[str]]] = {}
    for name in names:
        m = _EXPERT.search(name)
        if m:
            by_layer.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), set()).add(m.group(3))
    problems = []
    for layer, held in sorted(by_layer.items()):
        missing = [e for e in range(experts) if e not in held]
        if missing:
            problems.append(
                LintProblem(
                    f"model.layers.{layer}.mlp.experts",
                    f"{len(missing)} of {experts} experts have no tensors: {missing[:10]}",
                )
            )
        want = set.union(*held.values())
        for e, suffixes in sorted(held.items()):
            problems += [
                LintProblem(f"model.layers.{layer}.mlp.experts.{e}.{s}", "missing: the other experts hold it")
                for s in sorted(want - suffixes)
            ]
    return problems


# -- tied embeddings ---------------------------------------------------------------------------------------
def _same_bytes(a: _Tensor, b: _Tensor, chunk: int = 1 << 24) -> bool:
    if (a.dtype, a.shape, a.end - a.start) != (b.dtype, b.shape, b.end - b.start):
        return False
    with open(a.file, "rb") as fa, open(b.file, "rb") as fb:
        fa.seek(a.start)
        fb.seek(b.start)
        left = a.end - a.start
        while left > 0:
            n = min(chunk, left)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


def _check_tied(config: dict[str, Any], tensors: dict[str, _Tensor]) -> list[LintProblem]:
    """lm_head present when untied; equal to the embedding when tied and both are stored."""
    tie = config.get("tie_word_embeddings")
    embed = next((n for n in sorted(tensors) if re.search(r"(^|\.)embed_tokens\.weight$", n)), None)
    head = tensors.get("lm_head.weight")
    if embed is None or not isinstance(tie, bool):
        return []
    if not tie and head is None and not any(n.startswith("lm_head.") for n in tensors):
        return [
            LintProblem(
                "lm_head.weight",
                "missing while tie_word_embeddings is false: a loader would start lm_head from random values",
            )
        ]
    if tie and head is not None and not _same_bytes(tensors[embed], head):
        return [
            LintProblem(
                "lm_head.weight",
                f"differs from {embed} though tie_word_embeddings is true: a loader keeps "
                "one of the two, so trainer and engine may use different heads",
            )
        ]
    return []


# -- quantization_config -----------------------------------------------------------------------------------
def _must_stay(module: str) -> str | None:
    """What kind of module must stay unquantised, or None."""
    last = module.rsplit(".", 1)[-1]
    if last in ("lm_head", "embed_out"):
        return "lm_head"
    if last in ("embed_tokens", "wte", "wpe", "word_embeddings", "embed_in"):
        return "embedding"
    if last.endswith("norm") or last == "ln_f" or re.fullmatch(r"ln_\d+", last):
        return "norm"
    if re.search(r"(^|\.)(mlp|block_sparse_moe)\.(gate|router)$", module) or last == "router":
        return "router gate"
    return None


def _listed(entry: str, module: str, names: list[str]) -> bool:
    """Does an ignore-list entry cover `module` (whose tensors are `names`)? `re:` entries are regular
    expressions matched against the module or tensor names; plain ones name the module, a tensor, a dotted
    suffix of the module (HF's `lm_head`), or a prefix of it (a whole layer)."""
    if entry.startswith("re:"):
        pattern = re.compile(entry[3:])
        return any(pattern.match(x) for x in (module, *names))
    return module == entry or entry in names or module.endswith("." + entry) or module.startswith(entry + ".")


def _is_matrix(t: _Tensor | None) -> bool:
    # 1-D weights (norms) are no quantiser's target; 2-D ones are, Linear or not (router gates, embeddings)
    return t is not None and len(t.shape) == 2


def _check_quantization(config: dict[str, Any], tensors: dict[str, _Tensor]) -> list[LintProblem]:
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return []
    key = next(
        (k for k in _IGNORE_KEYS if k in qc),
        "ignore" if qc.get("quant_method") == "compressed-tensors" else "modules_to_not_convert",
    )
    entries = [str(e) for k in _IGNORE_KEYS for e in (qc.get(k) or [])]
    modules: dict[str, list[str]] = {}
    for name in tensors:
        modules.setdefault(_module(name), []).append(name)
    quantized = _quantized_modules(tensors)
    problems = []
    unlisted: dict[str, list[str]] = {}
    for module, names in sorted(modules.items()):
        kind = _must_stay(module)
        if kind is None:
            continue
        if module in quantized:
            problems.append(
                LintProblem(
                    module,
                    f"{kind} stored quantised ({quantized[module]}); a {kind} must stay "
                    f"unquantised: add it to quantization_config.{key}",
                )
            )
        elif _is_matrix(tensors.get(module + ".weight")) and not any(
            _listed(e, module, names) for e in entries
        ):
            unlisted.setdefault(kind, []).append(module)
    for kind, mods in unlisted.items():
        problems.append(
            LintProblem(
                mods[0],
                f"{kind} not in quantization_config.{key} ({len(mods)} module(s) like it: "
                f"{', '.join(mods[:4])}{', ...' if len(mods) > 4 else ''}): a quantiser "
                "that follows the list (e.g. slime's online INT4/FP8 weight update) would "
                "quantise it, and an engine that loads it by its plain name skips it",
            )
        )
    for entry in entries:
        if not re.fullmatch(r"[A-Z]\w*", entry) and not any(_listed(entry, m, n) for m, n in modules.items()):
            problems.append(
                LintProblem(
                    entry,
                    f"listed in quantization_config.{key} but the model has no such module "
                    "(renamed, or a wrong prefix?)",
                )
            )
    return problems
