"""First-difference reporting used by replay and diff."""

from __future__ import annotations

import pyarrow as pa

from artifacts.compare import first_layer_difference, first_metric_difference, first_table_difference
from trainers.collectives import fixed_order_sum


def test_table_difference_names_column_sample_and_max_abs_diff():
    a = pa.table({"sample_index": [1, 0], "log_probs": [[-0.5, -0.25], [-1.0]], "response": ["x", "y"]})
    same = pa.table({"sample_index": [0, 1], "log_probs": [[-1.0], [-0.5, -0.25]], "response": ["y", "x"]})
    assert first_table_difference(a, same) is None  # matched by sample_index, not row order
    b = pa.table({"sample_index": [1, 0], "log_probs": [[-0.5, -0.125], [-1.0]], "response": ["x", "y"]})
    diff = first_table_difference(a, b)
    assert diff is not None and "'log_probs', sample_index 1" in diff and "1.250e-01" in diff
    assert "row count" in (first_table_difference(a, a.slice(0, 1)) or "")


def test_metric_and_layer_differences():
    assert first_metric_difference([{"train/loss": 1.0}], [{"train/loss": 1.0}]) is None
    diff = first_metric_difference(
        [{"train/loss": 1.0, "train/kl": 0.0}], [{"train/loss": 1.0, "train/kl": 1e-9}]
    )
    assert diff is not None and "'train/kl'" in diff
    assert first_layer_difference(
        {"layer_0000": "a", "layer_0001": "b"}, {"layer_0000": "a", "layer_0001": "c"}
    ).startswith("layer 'layer_0001'")


def test_fixed_order_fold_is_a_pairwise_tree_for_powers_of_two():
    import torch

    parts = [torch.tensor([1e8]), torch.tensor([1.0]), torch.tensor([-1e8]), torch.tensor([1.0])]
    tree = (parts[0] + parts[1]) + (parts[2] + parts[3])
    ascending = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    assert torch.equal(fixed_order_sum(parts), tree) and not torch.equal(
        tree, ascending
    )  # order matters in fp32
    three = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])]
    assert fixed_order_sum(three).item() == 6.0
