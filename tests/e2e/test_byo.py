"""Bring your own model, data and reward: a slime launch line runs end to end."""

from __future__ import annotations

import pytest

from artifacts.store import RunPaths, read_metrics, read_rollout
from tests.byo import build_model_dir, write_prompts, write_reward_module

pytestmark = pytest.mark.e2e


def test_slime_flags_train_your_model_on_your_data(
    tmp_path, ray_session, prefect_server, monkeypatch, capsys
):
    from flows.cli import main

    model = build_model_dir(tmp_path / "model")
    train = write_prompts(tmp_path / "data" / "train.jsonl", 16)
    evals = write_prompts(tmp_path / "data" / "eval.jsonl", 4, offset=40)
    rm = write_reward_module(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")  # slime imports --custom-rm-path from the working directory
    run_dir = tmp_path / "run"
    argv = [
        "run",
        "--name",
        "byo",
        "--run-dir",
        str(run_dir),
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(train),
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
        str(evals),
        "--n-samples-per-eval-prompt",
        "1",
        "--eval-interval",
        "1",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "8",
        "--rollout-stop",
        "?",
    ]
    assert main(argv) == 0, capsys.readouterr().err

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)  # the saved one (BPE training is not bitwise repeatable)
    paths = RunPaths(run_dir)
    samples = read_rollout(paths.rollout(0))
    assert len(samples) == 8
    first = samples[0]
    assert first.prompt == (
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n"
        "What is 0 plus 0?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert first.prompt_tokens == tok.encode(first.prompt, add_special_tokens=False)
    assert first.label == "0" and first.metadata["source"] == "sums"
    assert {s.status for s in samples} <= {"completed", "truncated"}
    evals = [r for r in read_metrics(paths.metrics) if r["kind"] == "eval"]
    assert [r["rollout_id"] for r in evals] == [0, 1, 2]
    assert {"eval/sums", "eval/sums-truncated_ratio"} <= set(evals[0]["metrics"])
    steps = [r for r in read_metrics(paths.metrics) if r["kind"] == "step"]
    assert len(steps) == 2
    config = (run_dir / "config.yaml").read_text()
    assert f"prompt_data: {train}" in config and "custom_rm_path: my_reward.reward" in config
