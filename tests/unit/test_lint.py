"""Checkpoint lint on tiny safetensors checkpoints written here: each planted defect is named by shard or tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from artifacts.lint import CheckpointNotFound, lint_checkpoint
from flows.cli import main

CONFIG = {
    "model_type": "qwen2",
    "vocab_size": 16,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 12,
    "num_hidden_layers": 3,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tensors(config: dict = CONFIG) -> dict[str, torch.Tensor]:
    """A Qwen2-shaped state dict for `config` (bfloat16, deterministic values)."""
    h, v, i = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    q, kv = (
        config["num_attention_heads"] * config["head_dim"],
        config["num_key_value_heads"] * config["head_dim"],
    )
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}


def write_checkpoint(
    d: Path, shards: int = 1, config: dict = CONFIG, named: dict | None = None, index: dict | None = None
) -> Path:
    """An HF checkpoint dir: config.json plus model.safetensors, or `shards` shards (split by name order) with
    model.safetensors.index.json; `index` overrides the index's weight_map entries."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    named = tensors(config) if named is None else named
    if shards == 1:
        save_file(named, str(d / "model.safetensors"))
        return d
    names = sorted(named)
    weight_map = {}
    for k in range(shards):
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k * len(names) // shards : (k + 1) * len(names) // shards]
        save_file({n: named[n] for n in part}, str(d / shard))
        weight_map.update({n: shard for n in part})
    weight_map.update(index or {})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _problems(path: Path) -> list[str]:
    return [str(p) for p in lint_checkpoint(path).problems]


def test_a_consistent_checkpoint_passes_single_file_and_sharded(tmp_path):
    assert _problems(write_checkpoint(tmp_path / "one")) == []
    report = lint_checkpoint(write_checkpoint(tmp_path / "three", shards=3))
    assert report.problems == [] and report.files == 3 and report.tensors == len(tensors())


def test_a_missing_shard_is_named(tmp_path):
    d = write_checkpoint(tmp_path, shards=3)
    (d / "model-00002-of-00003.safetensors").unlink()
    problems = _problems(d)
    assert problems[0].startswith(
        "model-00002-of-00003.safetensors: missing: model.safetensors.index.json lists "
        "it for 11 tensor(s) in layer(s) 0, 1, e.g. model.layers.0."
    )
    assert len(problems) == 1  # its tensors and layers are not reported again one by one


def test_a_tensor_in_the_wrong_shard_is_named(tmp_path):
    d = write_checkpoint(tmp_path, shards=2, index={"model.norm.weight": "model-00001-of-00002.safetensors"})
    assert _problems(d) == [
        "model.norm.weight: in the wrong shard: model.safetensors.index.json lists it in "
        "model-00001-of-00002.safetensors, it is stored in model-00002-of-00002.safetensors"
    ]


def test_a_tensor_no_shard_holds_and_an_unlisted_tensor_are_named(tmp_path):
    named = tensors()
    extra = named.pop("model.layers.1.mlp.up_proj.weight")
    d = write_checkpoint(
        tmp_path,
        shards=2,
        named=named,
        index={"model.layers.1.mlp.up_proj.weight": "model-00001-of-00002.safetensors"},
    )
    problems = _problems(d)
    assert problems == [
        "model.layers.1.mlp.up_proj.weight: listed in model-00001-of-00002.safetensors by "
        "model.safetensors.index.json, but no shard holds it"
    ]
    save_file({"stray.weight": extra}, str(d / "model-00003-of-00002.safetensors"))
    assert any(p.startswith("model-00003-of-00002.safetensors: not listed in") for p in _problems(d))


def test_a_wrong_dtype_is_named(tmp_path):
    named = tensors()
    named["model.layers.2.self_attn.k_proj.weight"] = named["model.layers.2.self_attn.k_proj.weight"].float()
    assert _problems(write_checkpoint(tmp_path, named=named)) == [
        "model.layers.2.self_attn.k_proj.weight: dtype F32, config.json says BF16 (bfloat16)"
    ]


def test_a_wrong_shape_and_a_missing_layer_are_named(tmp_path):
    named = tensors()
    named["model.layers.0.mlp.up_proj.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
    for name in [n for n in named if n.startswith("model.layers.2.")]:
        del named[name]
    problems = _problems(write_checkpoint(tmp_path, named=named))
    assert "model.layers.0.mlp.up_proj.weight: shape [8, 8], config.json implies [12, 8]" in problems
    assert any(p.startswith("layer 2: no tensors (num_hidden_layers is 3)") for p in problems)


def test_a_tensor_missing_from_one_layer_is_named(tmp_path):
    named = tensors()
    del named["model.layers.1.mlp.up_proj.weight"]
    assert _problems(write_checkpoint(tmp_path, named=named)) == [
        "model.layers.1.mlp.up_proj.weight: missing: the other layers hold it"
    ]


def test_a_truncated_shard_is_named(tmp_path):
    d = write_checkpoint(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-10])
    assert any(p.startswith("model.safetensors: truncated: tensor ") for p in _problems(d))


def test_tied_embeddings(tmp_path):
    untied = tensors()
    del untied["lm_head.weight"]
    assert _problems(write_checkpoint(tmp_path / "untied", named=untied)) == [
        "lm_head.weight: missing while tie_word_embeddings is false: a loader would start lm_head from random values"
    ]
    tied = {**CONFIG, "tie_word_embeddings": True}
    same = tensors(tied)
    same["lm_head.weight"] = same["model.embed_tokens.weight"].clone()
    assert _problems(write_checkpoint(tmp_path / "tied", config=tied, named=same)) == []
    assert _problems(write_checkpoint(tmp_path / "differs", config=tied))[0].startswith(
        "lm_head.weight: differs from model.embed_tokens.weight though tie_word_embeddings is true"
    )


def _quantized(config: dict, ignore: list[str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """A compressed-tensors W4A16-style checkpoint: every Linear except those in `ignore` stored packed."""
    named = tensors(config)
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and t.dim() == 2 and "embed_tokens" not in name and module not in ignore:
            out[module + ".weight_packed"] = torch.zeros(t.shape[0], t.shape[1] // 8, dtype=torch.int32)
            out[module + ".weight_scale"] = torch.ones(t.shape[0], 1, dtype=torch.bfloat16)
        else:
            out[name] = t
    qc = {"quant_method": "compressed-tensors", "ignore": ignore, "config_groups": {}}
    return {**config, "quantization_config": qc}, out


def test_a_quantised_lm_head_is_named(tmp_path):
    config, named = _quantized(CONFIG, ignore=["model.embed_tokens"])
    problems = _problems(write_checkpoint(tmp_path, config=config, named=named))
    assert problems == [
        "lm_head: lm_head stored quantised (lm_head.weight_packed I32); a lm_head must stay "
        "unquantised: add it to quantization_config.ignore"
    ]
    config, named = _quantized(CONFIG, ignore=["lm_head", "model.embed_tokens"])
    assert _problems(write_checkpoint(tmp_path / "ok", config=config, named=named)) == []


def test_the_ignore_list_must_cover_router_gates_and_name_only_existing_modules(tmp_path):
    moe = {**CONFIG, "num_experts": 2, "moe_intermediate_size": 4}
    named = tensors(moe)
    for n in range(3):
        named[f"model.layers.{n}.mlp.gate.weight"] = torch.zeros(2, 8, dtype=torch.bfloat16)
        for e in range(2):
            for proj, shape in (("gate_proj", (4, 8)), ("up_proj", (4, 8)), ("down_proj", (8, 4))):
                named[f"model.layers.{n}.mlp.experts.{e}.{proj}.weight"] = torch.zeros(
                    shape, dtype=torch.bfloat16
                )
    del named["model.layers.1.mlp.experts.1.up_proj.weight"]
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {},
        "ignore": ["lm_head", "model.embed_tokens", "model.layers.9.mlp.gate"],
    }
    problems = _problems(write_checkpoint(tmp_path, config={**moe, "quantization_config": qc}, named=named))
    assert problems[0] == "model.layers.1.mlp.experts.1.up_proj.weight: missing: the other experts hold it"
    assert problems[1].startswith(
        "model.layers.0.mlp.gate: router gate not in quantization_config.ignore (3 module(s)"
    )
    assert problems[2] == (
        "model.layers.9.mlp.gate: listed in quantization_config.ignore but the model has no such "
        "module (renamed, or a wrong prefix?)"
    )
    qc["ignore"] = ["lm_head", "model.embed_tokens", "re:.*mlp\\.gate\\..*"]  # slime's recommended pattern
    named["model.layers.1.mlp.experts.1.up_proj.weight"] = torch.zeros(4, 8, dtype=torch.bfloat16)
    assert (
        _problems(write_checkpoint(tmp_path / "ok", config={**moe, "quantization_config": qc}, named=named))
        == []
    )


def test_a_save_dir_lints_every_iter_checkpoint_and_names_it(tmp_path):
    write_checkpoint(tmp_path / "ckpt" / "iter_0000001")
    d = write_checkpoint(tmp_path / "ckpt" / "iter_0000002", shards=2)
    (d / "model-00001-of-00002.safetensors").unlink()
    report = lint_checkpoint(tmp_path / "ckpt")
    assert len(report.dirs) == 2
    assert [str(p) for p in report.problems][0].startswith(
        "iter_0000002/model-00001-of-00002.safetensors: missing"
    )
    assert _problems(tmp_path / "ckpt" / "iter_0000001") == []
    with pytest.raises(CheckpointNotFound, match="not a checkpoint"):
        lint_checkpoint(tmp_path)


def test_the_cli_exit_codes(tmp_path, capsys):
    good = write_checkpoint(tmp_path / "good")
    assert main(["lint-ckpt", str(good)]) == 0
    assert capsys.readouterr().out.startswith(f"{good}: ok (1 checkpoint(s), 1 file(s), ")
    named = tensors()
    named["lm_head.weight"] = named["lm_head.weight"].half()
    bad = write_checkpoint(tmp_path / "bad", named=named)
    assert main(["lint-ckpt", str(bad)]) == 1
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"{bad}: lm_head.weight: dtype F16, config.json says BF16 (bfloat16)"
    )
    assert main(["lint-ckpt", str(tmp_path / "nothing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
