"""The --ci-test harness: every checker fires on a planted bug, naming checker, metric, value and
tolerance, and stays silent on a clean run."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from artifacts.store import RunPaths, read_metrics
from flows.doctor import diagnose
from tasks.metric_names import metric_of
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def ci_flags(checkpoint: str) -> dict:
    """--ci-test with the entropy bound at ln(vocab size), the most entropy any distribution over the
    vocabulary can have. The anchors' 0.7 is an LLM-scale bound; the tiny model's sampled entropy depends
    on the warm-up model, which the CPU's float kernels shape (2.31 on one machine after a step at lr 1e-2),
    so no bound in between holds on every machine. The entropy check itself is unit-tested in test_checks.py."""
    vocab = json.loads((Path(checkpoint) / "config.json").read_text())["vocab_size"]
    return {"ci_test": True, "ci_entropy_max": math.log(vocab)}


def _run(cfg):
    from flows.run import run_flow

    return asyncio.run(run_flow(cfg))


def _copy_checkpoint(base, dest, *, config=None, perturb=None):
    shutil.copytree(base, dest)
    if config:
        data = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**data, **config}))
    if perturb:
        weights = load_file(str(dest / "model.safetensors"))
        weights = {k: v + 0.05 if perturb in k else v for k, v in weights.items()}
        save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return str(dest)


def test_clean_run_passes_every_checker(tmp_path, ray_session, prefect_server, base_checkpoint):
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        ci={
            **ci_flags(base_checkpoint),
            "ci_metric_checker_key": "eval/tiny-arith",
            "ci_metric_checker_threshold": 0.0,
            "ci_save_grad_norm": str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.json"),
        },
    )
    _run(cfg)
    records = read_metrics(RunPaths(cfg.resolved_run_dir).metrics)
    # every metric the run logged is in the table docs/reference/metrics.md is generated from, under its kind
    unlisted = {
        (r["kind"], key)
        for r in records
        for key in r["metrics"]
        if (m := metric_of(key, plugins=False)) is None or m.kind != r["kind"]
    }
    assert not unlisted, f"add these to tasks/metric_names.py METRICS: {sorted(unlisted)}"
    checks = [r["metrics"] for r in records if r["kind"] == "check"]
    assert {"check/weight_update_equal": 1.0} in checks and {"check/metric_gate": 1.0} in checks
    assert not [c for c in checks if "check/violations" in c]
    # every rollout's first micro-batch re-executed from its snapshot gave the same bits (trainers/determinism.py)
    reexecuted = {"check/log_prob_deterministic": 1.0, "check/train_step_deterministic": 1.0}
    assert [c for c in checks if c == reexecuted] == [reexecuted] * cfg.rollout.num_rollout
    # and a few samples re-generated on the engines (engines/regenerate.py)
    regenerated = {"check/generate_deterministic": 1.0}
    assert [c for c in checks if c == regenerated] == [regenerated] * cfg.rollout.num_rollout
    assert (tmp_path / "gn" / "actor_1_3.json").is_file()
    again = small_config(
        tmp_path / "again",
        base_checkpoint,
        ci={
            **ci_flags(base_checkpoint),
            "ci_load_grad_norm": str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.json"),
        },
    )
    _run(again)  # the same config reproduces its grad norms


def test_kl_checker_catches_dropout_left_on(tmp_path, ray_session, prefect_server, base_checkpoint):
    ckpt = _copy_checkpoint(base_checkpoint, tmp_path / "dropout", config={"attention_dropout": 0.3})
    cfg = small_config(
        tmp_path,
        ckpt,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        # the re-execution check would stop the run first (dropout draws other masks): the KL checker is tested
        ci={**ci_flags(ckpt), "ci_disable_reexecution_checker": True},
        debug={"allow_model_dropout": True},  # refused otherwise (tests/unit/test_model_dropout.py)
    )
    with pytest.raises(
        Exception, match=r"\[KL checker\] train/ppo_kl = .* violates \|x\| < 1e-9 at rollout 0 step 0"
    ):
        _run(cfg)


def test_reexecution_catches_dropout_as_a_non_deterministic_log_prob_pass(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    # planted: a model that drops out (allowed), so the same micro-batch on the same weights gives other bits
    ckpt = _copy_checkpoint(base_checkpoint, tmp_path / "dropout", config={"attention_dropout": 0.3})
    cfg = small_config(
        tmp_path,
        ckpt,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci=ci_flags(ckpt),
        debug={"allow_model_dropout": True},
    )
    with pytest.raises(
        Exception,
        match=r"^log-prob is not deterministic: re-executing rollout 0's first micro-batch from its step-boundary "
        r"snapshot gave log-prob \S+ vs \S+ \(sample_index \d+, response token \d+\) on the same weights and inputs",
    ):
        _run(cfg)
    checks = [
        r["metrics"] for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == "check"
    ]
    assert {"check/log_prob_deterministic": 0.0} in checks


def test_logprob_checker_catches_a_reference_model_that_differs(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    # slime's meanings: the actor starts from --load (an HF dir here), the reference is --ref-load
    ref = _copy_checkpoint(base_checkpoint, tmp_path / "ref", perturb="layers.1.mlp")
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci=ci_flags(base_checkpoint),
        ref_load=ref,
        checkpoint={"load": base_checkpoint},
    )
    with pytest.raises(
        Exception,
        match=r"\[log-probs checker\] rollout/log_probs - rollout/ref_log_probs = .* "
        r"violates \|x\| < 1e-8 at rollout 0",
    ):
        _run(cfg)
    first = diagnose(cfg.resolved_run_dir)[0]
    assert first.title.startswith(
        "actor and reference log-probs differ before any training: the reference is not the starting model "
        "(its weights hash to "
    )


def test_weight_update_checker_catches_a_sync_that_drops_a_tensor(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    dropped = "model.layers.0.mlp.up_proj.weight"
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci={**ci_flags(base_checkpoint), "ci_fault_drop_weight": dropped},
    )
    with pytest.raises(
        Exception, match=rf"\[weight-update checker\] engine 0: 1 tensor\(s\) differ.*{dropped}"
    ):
        _run(cfg)


def test_metric_gate_fails_below_threshold_and_without_eval(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    gate = {"ci_metric_checker_key": "eval/tiny-arith", "ci_metric_checker_threshold": 1.01}
    cfg = small_config(tmp_path / "low", base_checkpoint, rollout={"num_rollout": 1}, ci=gate)
    with pytest.raises(Exception, match=r"\[metric checker\] eval/tiny-arith = .* violates >= 1.01"):
        _run(cfg)
    none = small_config(
        tmp_path / "none",
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci={**gate, "ci_metric_checker_threshold": 0.0},
    )
    with pytest.raises(Exception, match="no eval ran"):
        _run(none)


def test_grad_norm_from_another_config_is_caught(tmp_path, ray_session, prefect_server, base_checkpoint):
    tpl = str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.json")
    _run(
        small_config(
            tmp_path / "a",
            base_checkpoint,
            rollout={"num_rollout": 1},
            eval={"eval_interval": None},
            ci={"ci_save_grad_norm": tpl},
        )
    )
    other = small_config(
        tmp_path / "b",
        base_checkpoint,
        rollout={"num_rollout": 1, "rollout_seed": 7},
        eval={"eval_interval": None},
        ci={"ci_load_grad_norm": tpl},
    )
    with pytest.raises(
        Exception, match=r"\[grad-norm checker\] train/grad_norm = .* violates isclose to recorded"
    ):
        _run(other)
