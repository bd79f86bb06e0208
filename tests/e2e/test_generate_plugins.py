"""slime's generation plug-ins in real runs on the tiny model: the calculator-tool example
(--custom-generate-function-path with a slime-style --custom-rm-path) and the rollout-function example
(--rollout-function-path), each written as a rollout Parquet that the trainer and `rollflow replay` read."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path

import pytest

from artifacts.store import RunPaths, read_metrics, read_rollout
from examples.calculator_tool import calculator
from tests.e2e.test_loop import small_config

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _runs(cfg) -> None:
    from flows.run import run_flow

    asyncio.run(run_flow(cfg))


def _records(cfg, kind: str) -> list[dict]:
    return [r["metrics"] for r in read_metrics(RunPaths(cfg.resolved_run_dir).metrics) if r["kind"] == kind]


def _tool_runs(tokenizer, row) -> list[tuple[int, str]]:
    """(position, text) of every run of loss-mask-0 tokens in a row's response."""
    runs, start = [], None
    for i, m in enumerate([*row.loss_mask, 1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            runs.append((start, tokenizer.decode(row.response_tokens[start:i])))
            start = None
    return runs


def test_calculator_tool_example_masks_tool_output_and_replays(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    from transformers import AutoTokenizer

    from flows.replay import replay_flow

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={
            "custom_generate_function_path": "examples.calculator_tool.calculator.generate",
        },
        data={
            "prompt_data": str(EXAMPLES / "calculator_tool" / "prompts.jsonl"),
            "input_key": "prompt",
            "label_key": "label",
            "apply_chat_template": True,
            "eval_prompt_data": ["calc", str(EXAMPLES / "calculator_tool" / "prompts.jsonl")],
        },
        reward={"custom_rm_path": "examples.calculator_tool.calculator.reward"},
        eval={"eval_interval": 2},
    )
    _runs(cfg)
    tok = AutoTokenizer.from_pretrained(base_checkpoint)
    paths = RunPaths(cfg.resolved_run_dir)
    rows = [s for i in range(2) for s in read_rollout(paths.rollout(i))]
    assert len(rows) == 2 * 4 * 4
    first = [r for r in rows if r.metadata.get("calculator_first")]
    assert len(first) == len(rows) // 2  # every other prompt row of the example asks for it
    evals = [s for i in (0, 2) for s in read_rollout(paths.eval_rollout(i))]  # evals generate through it too
    assert len(evals) == 2 * 64 and {r.metadata["eval_dataset"] for r in evals} == {"calc"}
    assert [m["eval/calc"] for m in _records(cfg, "eval")] == pytest.approx(
        [sum(r.reward for r in evals[:64]) / 64, sum(r.reward for r in evals[64:]) / 64]
    )
    for r in rows + evals:
        tools = _tool_runs(tok, r)
        question = re.search(r"\d+\+\d+", r.prompt).group(0)
        if r.metadata.get("calculator_first"):  # the scaffold's call: '=' and the calculator's value, masked
            assert tools[0] == (0, "=" + calculator.calculate(question)), r
            tools = tools[1:]
        for pos, text in tools:  # any call the model made itself: its own '=' (trained on), then the value
            assert r.response_tokens[pos - 1] == tok.convert_tokens_to_ids("=") and r.loss_mask[pos - 1] == 1
            assert text.isdigit()
        masked = [lp for lp, m in zip(r.rollout_log_probs, r.loss_mask, strict=True) if m == 0]
        assert masked == [0.0] * len(masked)  # placeholders, never read
        assert any(r.loss_mask) or r.status == "failed"
        # the slime-style reward scored the whole multi-turn response of slime's sample
        assert r.reward == float(calculator.final_answer(r.response) == r.label), r
    # the trainer's log-probs of the model's own tokens match the engine's: the tool tokens, whose engine
    # placeholders are 0.0 and whose trainer log-probs are not, are left out on the trainer's side too
    trainer_side = [m for m in _records(cfg, "rollout") if "rollout/log_probs" in m]
    assert len(trainer_side) == 2
    for m in trainer_side:
        assert abs(m["rollout/log_probs"] - m["rollout/rollout_log_probs"]) < 1e-3, m
    steps = _records(cfg, "step")
    assert len(steps) == 4 and any(
        s["train/grad_norm"] > 0 for s in steps
    )  # (a group scored all alike has none)
    run_dir = str(cfg.resolved_run_dir)
    for task in ("generate", "train-step"):  # the plug-in's rollout replays like any other
        result = asyncio.run(replay_flow(run_dir, 1, task))
        assert result["identical"], (task, result["difference"])


def test_rollout_function_example_replaces_generation(tmp_path, ray_session, prefect_server, base_checkpoint):
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={
            "rollout_function_path": "examples.rollout_function.rollout.generate_rollout",
            "num_rollout": 1,
        },
        eval={"eval_interval": None},
        checkpoint={"save": None, "save_interval": None},
    )
    _runs(cfg)
    rows = read_rollout(RunPaths(cfg.resolved_run_dir).rollout(0))
    assert [r.sample_index for r in rows] == list(range(16))
    tries = {}
    for r in rows:
        tries.setdefault(r.group_index, set()).add(r.metadata["tries"])
        assert r.reward == (1.0 if r.response.strip() == r.label else 0.0)  # the run's tiny-arith reward
    for group, seen in tries.items():
        rewards = {r.reward for r in rows if r.group_index == group}
        assert len(seen) == 1  # a group is kept whole, from one try
        if seen == {1}:  # kept at the first try: its samples did not all score alike
            assert len(rewards) > 1, (group, rewards)
    assert len(_records(cfg, "step")) == 2


def _window(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of a window of 0/1 (or [0, 1]) values."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(max(mean * (1 - mean), 1e-12) / len(values))


def test_calculator_tool_example_learns_to_call_the_tool(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """The warm-up model almost never writes '=' (the call); rewarded calls teach it to, within 32 rollouts. The bar
    is the run's own: the last 5 rollouts' call rate (on rows where the model must decide) and mean reward above
    the first 5's by more than four standard errors."""
    rollouts = 32
    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={
            "num_rollout": rollouts,
            "rollout_batch_size": 64,
            "n_samples_per_prompt": 8,
            "custom_generate_function_path": "examples.calculator_tool.calculator.generate",
        },
        data={
            "prompt_data": str(EXAMPLES / "calculator_tool" / "prompts.jsonl"),
            "input_key": "prompt",
            "label_key": "label",
            "apply_chat_template": True,
            "rollout_shuffle": True,
        },
        reward={"custom_rm_path": "examples.calculator_tool.calculator.reward"},
        eval={"eval_interval": None},
        train={
            "global_batch_size": None,
            "micro_batch_size": None,
            "lr": 1e-3,
            "lr_decay_style": "constant",
            "weight_decay": 0.0,
        },
        checkpoint={"save": None, "save_interval": None},
    )
    _runs(cfg)
    paths = RunPaths(cfg.resolved_run_dir)
    calls, rewards = [], []
    for i in range(rollouts):
        rows = read_rollout(paths.rollout(i))
        calls.append([float(0 in r.loss_mask) for r in rows if not r.metadata.get("calculator_first")])
        rewards.append([r.reward for r in rows])
    for name, series in (("tool-call rate", calls), ("reward", rewards)):
        (first, se_first), (last, se_last) = (
            _window([v for r in series[:5] for v in r]),
            _window([v for r in series[-5:] for v in r]),
        )
        margin = 4 * math.hypot(se_first, se_last)
        assert last - first > margin, (
            f"{name} {first:.3f} -> {last:.3f}: gain below 4 standard errors ({margin:.3f})"
        )


def test_group_reward_example_scores_each_group_together(
    tmp_path, ray_session, prefect_server, base_checkpoint
):
    """--group-rm: the majority-vote reward sees each prompt group whole, so every reward follows from its group."""
    from examples.group_reward.majority import majority_vote
    from rollout.sample import from_row

    cfg = small_config(
        tmp_path,
        base_checkpoint,
        rollout={"num_rollout": 1},
        reward={"group_rm": True, "custom_rm_path": "examples.group_reward.majority.majority_vote"},
        eval={"eval_interval": None},
        checkpoint={"save": None, "save_interval": None},
    )
    _runs(cfg)
    rows = read_rollout(RunPaths(cfg.resolved_run_dir).rollout(0))
    groups: dict[int, list] = {}
    for r in rows:
        groups.setdefault(r.group_index, []).append(r)
    assert len(groups) == 4 and all(len(g) == 4 for g in groups.values())
    for g in groups.values():
        expected = asyncio.run(majority_vote(None, [from_row(r) for r in g]))
        assert [r.reward for r in g] == expected, [(r.response, r.reward) for r in g]
    assert any(1.0 in [r.reward for r in g] for g in groups.values())  # some group agreed on an answer
    assert len(_records(cfg, "step")) == 2
