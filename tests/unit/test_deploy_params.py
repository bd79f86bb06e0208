"""Deployment runs: partial `cfg` parameters deep-merge over the served defaults (pure part; the served
round trip through a real Prefect server is in tests/e2e/test_deploy.py)."""

from __future__ import annotations

from config import RunConfig
from deployments.params import apply_served_defaults, deep_merge, merge_over_defaults
from flows.resolve import apply_recipe


def _as_prefect_passes_it(cfg: dict) -> RunConfig:
    """The `cfg` a flow run receives: Prefect validates the stored parameter dict against the flow signature."""
    from flows.run import run_flow

    return run_flow.validate_parameters({"cfg": cfg})["cfg"]


def test_deep_merge_replaces_leaves_and_merges_dicts():
    base = {
        "name": "a",
        "rollout": {"num_rollout": 5, "rollout_batch_size": 4},
        "data": {"eval_prompt_data": ["x", "y"]},
    }
    over = {"rollout": {"num_rollout": 3}, "data": {"eval_prompt_data": ["z", "w"]}}
    assert deep_merge(base, over) == {
        "name": "a",
        "rollout": {"num_rollout": 3, "rollout_batch_size": 4},
        "data": {"eval_prompt_data": ["z", "w"]},
    }
    assert base["rollout"] == {"num_rollout": 5, "rollout_batch_size": 4}  # inputs untouched


def test_partial_run_parameters_keep_the_other_served_defaults():
    served = {
        "name": "nightly",
        "rollout": {"num_rollout": 5, "rollout_batch_size": 4},
        "train": {"global_batch_size": 8, "lr": 1e-3},
    }
    cfg = merge_over_defaults(served, _as_prefect_passes_it({"rollout": {"num_rollout": 3}}))
    assert cfg.name == "nightly" and cfg.rollout.num_rollout == 3 and cfg.rollout.rollout_batch_size == 4
    assert cfg.train.global_batch_size == 8 and cfg.train.lr == 1e-3
    # no run parameters at all: the served config itself
    assert merge_over_defaults(served, _as_prefect_passes_it(served)) == RunConfig.model_validate(served)


def test_a_full_form_submission_counts_only_the_changed_fields():
    """The UI's Run form sends every field; the recipe's data presets must still apply to the unchanged ones."""
    served = {"name": "served", "rollout": {"num_rollout": 5}}
    form = deep_merge(RunConfig().model_dump(mode="json"), served)  # the form shows the served config
    form["rollout"]["num_rollout"] = 100  # edited back to RunConfig's default: still the value the run gets
    form["train"]["lr"] = 1e-3
    cfg = merge_over_defaults(served, _as_prefect_passes_it(form))
    assert (cfg.name, cfg.rollout.num_rollout, cfg.train.lr) == ("served", 100, 1e-3)
    assert cfg.model_fields_set == {"name", "train"} and cfg.data.model_fields_set == set()
    resolved = apply_recipe(cfg, build=False)  # raised "--input-key ... given without --prompt-data" before
    assert resolved.data.input_key == "prompt" and resolved.data.apply_chat_template


def test_outside_a_deployment_run_the_config_is_untouched():
    cfg = _as_prefect_passes_it({"rollout": {"num_rollout": 3}})
    assert apply_served_defaults(cfg) is cfg
