"""The pieces that name a broken weight sync: per-tensor hashes, layer grouping, the drop-weight fault's patterns."""

from __future__ import annotations

import pytest
import torch

from artifacts.hashing import differing_tensors, group_by_layer, layer_hashes, tensor_hashes
from faults.drop_weight import dropped_weights

NAMES = [
    "model.embed_tokens.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
    "model.layers.10.mlp.up_proj.weight",
    "model.norm.weight",
]


def test_dropped_weights_takes_names_lists_and_globs():
    assert dropped_weights(None, NAMES) == [] and dropped_weights("", NAMES) == []
    assert dropped_weights("model.norm.weight", NAMES) == ["model.norm.weight"]
    assert dropped_weights("model.layers.*.mlp.up_proj.weight", NAMES) == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.10.mlp.up_proj.weight",
    ]
    assert dropped_weights("model.norm.weight, model.layers.1.*", NAMES) == [
        "model.layers.1.mlp.up_proj.weight",
        "model.norm.weight",
    ]


def test_a_drop_pattern_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match=r"--ci-fault-drop-weight 'model.layers.9.\*' matches no weight"):
        dropped_weights("model.norm.weight,model.layers.9.*", NAMES)


def test_group_by_layer_orders_layers_numerically_and_non_layer_last():
    assert list(group_by_layer(reversed(NAMES))) == ["layer_0000", "layer_0001", "layer_0010", "non_layer"]
    assert group_by_layer(NAMES)["layer_0000"] == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]


def test_tensor_hashes_name_exactly_the_tensors_that_differ():
    named = {n: torch.arange(6, dtype=torch.float32).reshape(2, 3) + i for i, n in enumerate(NAMES)}
    changed = {**named, NAMES[3]: named[NAMES[3]].clone()}
    changed[NAMES[3]][1, 2] += 1e-6
    assert differing_tensors(tensor_hashes(named), tensor_hashes(changed)) == [NAMES[3]]
    # dtype and shape count, as in the per-layer hashes
    reshaped = {**named, NAMES[0]: named[NAMES[0]].reshape(3, 2)}
    assert differing_tensors(tensor_hashes(named), tensor_hashes(reshaped)) == [NAMES[0]]
    assert differing_tensors(tensor_hashes(named), {}) == sorted(NAMES)
    # the per-layer hashes are unchanged by the refactor: still name, shape, dtype, bytes per layer
    assert layer_hashes(named) != layer_hashes(changed) and layer_hashes(named) == layer_hashes(dict(named))
