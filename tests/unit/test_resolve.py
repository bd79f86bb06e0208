"""From flags to a startable run: the recipe preset, the dry run, and bad input refused before anything is
started or written."""

from __future__ import annotations

import sys

import pytest

from flows.cli import build_config, main, make_parser
from flows.resolve import apply_recipe, resolve
from tests.byo import build_model_dir, write_prompts, write_reward_module


def parse(*argv: str):
    return build_config(make_parser().parse_args(["run", *argv]))


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo")
    return {
        "model": str(build_model_dir(root / "model")),
        "data": str(write_prompts(root / "train.jsonl", 12)),
        "eval": str(write_prompts(root / "eval.jsonl", 4, offset=50)),
        "root": root,
    }


def test_the_tiny_arith_preset_fills_in_data_keys_eval_and_reward():
    cfg = apply_recipe(parse(), build=False)
    d = cfg.data
    assert d.prompt_data.endswith("train.parquet") and d.input_key == "prompt" and d.label_key == "label"
    assert d.apply_chat_template and d.rollout_shuffle
    assert [n for n, _ in d.eval_datasets] == ["tiny-arith"] and cfg.reward.rm_type == "tiny-arith"


def test_the_long_arith_preset_also_fills_in_the_response_length(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "ROLLFLOW_CACHE_DIR", str(tmp_path)
    )  # its prompt files are written there; no model is built
    cfg = apply_recipe(parse("--recipe", "long-arith"), build=False)
    assert cfg.recipe == "long-arith" and cfg.reward.rm_type == "long-arith"
    assert [n for n, _ in cfg.data.eval_datasets] == ["long-arith"] and cfg.data.input_key == "prompt"
    assert cfg.rollout.rollout_max_response_len == 256 and cfg.hf_checkpoint.startswith(
        str(tmp_path / "long-arith-")
    )
    given = apply_recipe(parse("--recipe", "long-arith", "--rollout-max-response-len", "300"), build=False)
    assert given.rollout.rollout_max_response_len == 300
    assert apply_recipe(parse(), build=False).rollout.rollout_max_response_len == 6  # tiny-arith: unchanged


def test_data_keys_without_prompt_data_are_refused():
    with pytest.raises(ValueError, match="--input-key given without --prompt-data"):
        apply_recipe(parse("--input-key", "question"), build=False)


def test_prompt_data_needs_a_reward(byo):
    with pytest.raises(ValueError, match="no reward: add --rm-type"):
        apply_recipe(parse("--hf-checkpoint", byo["model"], "--prompt-data", byo["data"]), build=False)


def test_your_own_model_data_and_reward_resolve(byo, monkeypatch):
    monkeypatch.syspath_prepend(str(byo["root"] / "rm"))
    rm = write_reward_module(byo["root"] / "rm")
    cfg, src = resolve(
        parse(
            "--hf-checkpoint",
            byo["model"],
            "--prompt-data",
            byo["data"],
            "--input-key",
            "messages",
            "--label-key",
            "answer",
            "--metadata-key",
            "info",
            "--apply-chat-template",
            "--custom-rm-path",
            rm,
            "--eval-prompt-data",
            "sums",
            byo["eval"],
        )
    )
    assert len(src.train.prompts) == 12 and src.train.prompts[0].text.startswith("<|im_start|>system\n")
    assert src.train.prompts[0].metadata == {"source": "sums", "k": 0}
    assert [n for n, _ in src.evals] == ["sums"] and src.scorer.name == rm
    assert (
        cfg.data.eval_prompt_data == ["sums", byo["eval"]] and cfg.recipe == "tiny-arith"
    )  # nothing of it used


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--custom-rm-path", "nowhere_xyz.fn"], "cannot import 'nowhere_xyz'"),
        (["--rm-type", "bogus"], "--rm-type 'bogus': unknown"),
        (["--rm-type", "math", "--label-key", "missing"], "no key 'missing' (--label-key)"),
        (
            ["--rm-type", "math", "--eval-prompt-data", "e", "/nonexistent.jsonl"],
            "--eval-prompt-data e /nonexistent.jsonl: no such file",
        ),
    ],
)
def test_bad_input_is_named_before_anything_starts(byo, tmp_path, capsys, monkeypatch, extra, needle):
    monkeypatch.delitem(sys.modules, "flows.run", raising=False)
    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--hf-checkpoint",
        byo["model"],
        "--prompt-data",
        byo["data"],
        "--input-key",
        "messages",
        "--apply-chat-template",
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
    assert (
        not run_dir.exists() and "flows.run" not in sys.modules
    )  # nothing written, Ray/Prefect never imported


def test_a_template_mismatch_fails_the_run_before_it_starts(tmp_path, capsys):
    from tests.byo import CHATML

    model = build_model_dir(tmp_path / "m", CHATML.replace("{{ m['role'] }}\n", "{{ m['role'] }}:\n"))
    data = write_prompts(tmp_path / "p.jsonl", 3)
    assert (
        main(
            [
                "run",
                "--hf-checkpoint",
                str(model),
                "--prompt-data",
                str(data),
                "--input-key",
                "messages",
                "--apply-chat-template",
                "--rm-type",
                "exact_match",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert "chat template check failed" in capsys.readouterr().err


def test_dry_run_prints_the_resolved_config_and_starts_nothing(byo, tmp_path, capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "flows.run", raising=False)
    assert (
        main(
            [
                "run",
                "--dry-run",
                "--hf-checkpoint",
                byo["model"],
                "--prompt-data",
                byo["data"],
                "--input-key",
                "messages",
                "--apply-chat-template",
                "--rm-type",
                "exact_match",
                "--label-key",
                "answer",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"prompt_data: {byo['data']}" in out and "train: " in out and "12 rows, 12 prompts" in out
    assert "reward: exact_match" in out and not (tmp_path / "run").exists() and "flows.run" not in sys.modules


def test_check_template_command_passes_and_names_a_planted_mismatch(byo, tmp_path, capsys):
    from tests.byo import CHATML

    assert (
        main(
            [
                "check-template",
                "--hf-checkpoint",
                byo["model"],
                "--prompt-data",
                byo["data"],
                "--input-key",
                "messages",
                "--label-key",
                "answer",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "rollflow check-template: ok (3 example(s))" in out and "loss mask on  : ['0', '<|im_end|>']" in out
    )
    planted = build_model_dir(
        tmp_path / "planted",
        CHATML.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n\n{% endif %}"),
    )
    assert (
        main(
            [
                "check-template",
                "--hf-checkpoint",
                str(planted),
                "--prompt-data",
                byo["data"],
                "--input-key",
                "messages",
                "--label-key",
                "answer",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "MISMATCH: token" in err and "the engine sees" in err


def test_the_longest_prompt_and_the_response_fill_at_most_the_models_positions(byo):
    from flows.resolve import model_positions

    given = ("--hf-checkpoint", byo["model"], "--prompt-data", byo["data"], "--input-key", "messages")
    flags = (*given, "--apply-chat-template", "--rm-type", "exact_match", "--label-key", "answer")
    cfg, src = resolve(parse(*flags))
    room = model_positions(cfg.hf_checkpoint) - max(len(p.tokens) for p in src.train.prompts)
    resolve(parse(*flags, "--rollout-max-response-len", str(room)))  # exactly the model's positions
    with pytest.raises(ValueError, match=rf"--rollout-max-response-len {room + 1}: .*: at most {room}$"):
        resolve(parse(*flags, "--rollout-max-response-len", str(room + 1)))
