"""End to end: doctor on a real clean run, and the messages that name the broken part on real planted bugs
(a run stopped at a checker, a sync bug across several layers, engines that silently keep a stale tensor)."""

from __future__ import annotations

import asyncio

import pytest

from artifacts.lint import lint_checkpoint
from config import RunConfig
from flows.cli import main
from flows.diff import first_divergence
from flows.doctor import diagnose
from tests.e2e.test_ci_checks import _copy_checkpoint, ci_flags
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e


def _run(cfg: RunConfig) -> dict:
    from flows.run import run_flow

    return asyncio.run(run_flow(cfg))


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, ray_session, prefect_server, base_checkpoint) -> RunConfig:
    """small_config's two rollouts at the default recipe's learning rate, eval every rollout, a checkpoint after
    each. (small_config's lr 1e-2 is not a clean run: after one rollout the tiny model stops producing <eos>,
    every response runs into the max length, and the doctor says so.)"""
    cfg = small_config(tmp_path_factory.mktemp("clean"), base_checkpoint, train={"lr": 2e-4})
    _run(cfg)
    return cfg


def test_doctor_reports_nothing_above_info_on_a_clean_run(clean_run, capsys):
    findings = diagnose(clean_run.resolved_run_dir)
    assert [f for f in findings if f.severity != "info"] == [], findings
    assert (
        lint_checkpoint(str(clean_run.checkpoint.save)).problems == []
    )  # the trainer's own checkpoints lint clean
    assert main(["doctor", str(clean_run.resolved_run_dir)]) == 0
    assert capsys.readouterr().out.startswith(f"rollflow doctor {clean_run.resolved_run_dir}: no findings")


def test_diff_against_a_run_stopped_at_a_checker_names_the_first_differing_column(
    clean_run, tmp_path, base_checkpoint
):
    # planted: dropout left on (the KL checker stops the run at rollout 0) and another prompt order
    ckpt = _copy_checkpoint(base_checkpoint, tmp_path / "dropout", config={"attention_dropout": 0.3})
    stopped = small_config(
        tmp_path,
        ckpt,
        train={"lr": 2e-4},
        rollout={"rollout_seed": 7},
        ci={**ci_flags(ckpt), "ci_disable_reexecution_checker": True},  # else it stops the run before KL
        debug={"allow_model_dropout": True},  # refused otherwise
    )
    with pytest.raises(Exception, match=r"\[KL checker\] train/ppo_kl"):
        _run(stopped)
    diff = first_divergence(clean_run.resolved_run_dir, stopped.resolved_run_dir)
    assert diff is not None and diff.startswith("rollout 0 samples: column 'prompt', sample_index 0: ")
    # the doctor names the planted cause first, with the model config's dropout as the evidence
    first = diagnose(stopped.resolved_run_dir)[0]
    assert (first.severity, first.rule) == ("error", "first-step-kl")
    assert "attention_dropout = 0.3" in first.title


def test_a_sync_bug_in_several_layers_lists_every_layer(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci={**ci_flags(base_checkpoint), "ci_fault_drop_weight": "model.layers.*.mlp.up_proj.weight"},
    )
    names = "; ".join(f"layer_000{i}: model.layers.{i}.mlp.up_proj.weight" for i in range(3))
    with pytest.raises(
        Exception,
        match=rf"\[weight-update checker\] engine 0: 3 tensor\(s\) differ .*in 3 layer "
        rf"group\(s\): {names}$",
    ):
        _run(cfg)
    first = diagnose(cfg.resolved_run_dir)[0]
    assert (first.rule, first.evidence) == ("checker", "check/weight_update_equal = 0.0 at rollout 0")


def test_engines_out_of_sync_name_both_hashes_and_the_first_differing_tensor(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    # planted without --ci-test: the engines silently keep their own copy of layer 1's MLP at every sync
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        eval={"eval_interval": None},
        ci={"ci_fault_drop_weight": "model.layers.1.mlp.*"},
    )
    with pytest.raises(Exception) as info:
        _run(cfg)
    message = str(info.value)
    assert (
        "rollout 0: engines [0] do not hold the trainer's weights after the sync: engine 0: holds weight "
        "version 1 as expected but its weights hash to " in message
    )
    assert (
        "first differing tensor model.layers.1.mlp.down_proj.weight; 3 tensor(s) differ: layer_0001: "
        "model.layers.1.mlp.down_proj.weight, model.layers.1.mlp.gate_proj.weight, "
        "model.layers.1.mlp.up_proj.weight" in message
    )
    engine_sha, trainer_sha = message.split("hash to ")[1].split(", the trainer's to ")
    assert len(engine_sha) == 64 and trainer_sha[:64] != engine_sha

    # the run recorded how it failed: the doctor names the always-on check with the console's own line
    first = diagnose(cfg.resolved_run_dir)[0]
    assert (first.severity, first.rule) == ("error", "engines-in-sync")
    assert first.evidence == f"CheckFailed: {message} (rollout 0, stage check)"
