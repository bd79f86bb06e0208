"""Synthetic run directories for the doctor's tests: a healthy run by default, and one knob per planted bug.

The run is written the way a real one is: config.yaml from a validated RunConfig, rollout / eval / log-prob
Parquet artifacts through the artifact store, and metrics.jsonl records whose rollout stats come from the
loop's own functions (tasks.metrics.reward_stats, trainers.rollout_stats.logprob_stats). Every value is a
function of (rollout, group, sample), so a run is the same on every machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from artifacts.schema import Sample
from artifacts.store import RunPaths, append_metrics, write_rollout, write_table
from config import RunConfig, dump_yaml
from tasks.metrics import eval_stats, reward_stats
from trainers.rollout_stats import logprob_stats

EOS = 1  # the tiny-arith tokenizer's <eos>
DIGITS = {str(d): 4 + d for d in range(10)}  # its digit ids


def tokenizer_dir(path: Path) -> Path:
    """The tiny-arith tokenizer saved as an HF dir, with a config.json naming its vocabulary size."""
    from recipes.tiny_arith.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(str(path))
    (path / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "vocab_size": len(tok), "attention_dropout": 0.0})
    )
    return path


@dataclass
class Plan:
    """A synthetic run; the defaults are a healthy one (rewards vary within groups, log-probs agree, entropy
    and gradients steady, eval follows the reward). Override a field to plant a bug."""

    rollouts: int = 12
    groups: int = 4
    n: int = 4
    max_len: int = 6
    steps_per_rollout: int = 2
    reward: Callable[[int, int, int], float] = lambda rid, g, j: float((rid + g + j) % 2)
    label: Callable[[int], str] = lambda g: str(20 + g)
    length: Callable[[int, int, int], int] = lambda rid, g, j: 2 + (g + j) % 3
    stop_ids: list[int] = field(default_factory=lambda: [EOS])
    truncate: Callable[[int, int, int], bool] = lambda rid, g, j: False
    gap: Callable[[int], float] = lambda rid: 0.0  # trainer log-prob minus engine log-prob, per token
    entropy: Callable[[int], float] = lambda rid: 0.5 - 0.01 * rid
    grad_norm: Callable[[int, int], float] = lambda rid, step: 4.0 + (rid * 7 + step * 3) % 5 * 0.5
    ppo_kl: Callable[[int, int], float] = lambda rid, k: 0.0 if k == 0 else 0.002 * (1 + (rid + k) % 3)
    prompt_tokens: Callable[[list[int]], list[int]] = lambda tokens: tokens
    eval_every: int = 4
    eval_accuracy: Callable[[int], float] = lambda rid: 0.4 + 0.01 * rid
    nan_step: tuple[int, int] | None = None  # (rollout, step within it) whose grad norm is NaN
    config: dict = field(default_factory=dict)  # sections merged into the RunConfig


def _response(rid: int, g: int, j: int, plan: Plan) -> tuple[list[int], str]:
    if plan.truncate(rid, g, j):
        return [DIGITS[str((rid + g + j + k) % 10)] for k in range(plan.max_len)], "truncated"
    n = max(1, min(plan.length(rid, g, j), plan.max_len))
    return [DIGITS[str((g + j + k) % 10)] for k in range(n - 1)] + [EOS], "completed"


def _samples(rid: int, plan: Plan, tok, eval_mode: bool = False) -> list[Sample]:
    out = []
    groups = 16 if eval_mode else plan.groups
    n = 4 if eval_mode else plan.n
    for g in range(groups):
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"{g}+20"}], tokenize=False, add_generation_prompt=True
        )
        tokens = plan.prompt_tokens(tok.encode(text, add_special_tokens=False))
        for j in range(n):
            response, status = _response(rid, g, j, plan)
            index = g * n + j
            if eval_mode:  # correct for the first `accuracy` share of the eval samples
                reward = float(index < round(plan.eval_accuracy(rid) * groups * n))
            else:
                reward = plan.reward(rid, g, j)
            out.append(
                Sample(
                    rollout_id=rid,
                    group_index=g,
                    sample_index=index,
                    prompt=text,
                    prompt_tokens=tokens,
                    response=tok.decode(response, skip_special_tokens=True),
                    response_tokens=response,
                    response_length=len(response),
                    label=plan.label(g),
                    reward=reward,
                    status=status,
                    loss_mask=[1] * len(response),
                    rollout_log_probs=[-0.5 - 0.1 * k for k in range(len(response))],
                    weight_version=rid,
                    seed=1000 * rid + index,
                    metadata={"eval_dataset": "arith"} if eval_mode else {},
                )
            )
    return out


def _record(paths: RunPaths, kind: str, rid: int, metrics: dict, step: int | None = None) -> None:
    record: dict = {"kind": kind, "rollout_id": rid}
    if step is not None:
        record["step"] = step
    append_metrics(paths.metrics, {**record, "metrics": metrics})


def make_run(root: Path, tokenizer: Path, plan: Plan | None = None) -> Path:
    """Write the synthetic run `plan` under `root` (with `tokenizer` as its hf_checkpoint); returns the run dir."""
    from transformers import AutoTokenizer

    plan = plan or Plan()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    run = root / "run"
    paths = RunPaths(run)
    data = {
        "name": "synthetic",
        "run_dir": str(run),
        "hf_checkpoint": str(tokenizer),
        "rollout": {
            "num_rollout": plan.rollouts,
            "rollout_batch_size": plan.groups,
            "n_samples_per_prompt": plan.n,
            "rollout_max_response_len": plan.max_len,
        },
        "train": {"global_batch_size": plan.groups * plan.n // plan.steps_per_rollout},
    }
    for section, values in plan.config.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    cfg = RunConfig.model_validate(data)
    paths.rollout(0).parent.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(dump_yaml(cfg))
    sampling = {"sampling": json.dumps({"max_new_tokens": plan.max_len, "stop_token_ids": plan.stop_ids})}
    for rid in range(plan.rollouts):
        if rid % plan.eval_every == 0:
            _eval(paths, rid, plan, tok)
        samples = _samples(rid, plan, tok)
        write_rollout(paths.rollout(rid), samples, metadata=sampling)
        rows = [
            {
                "sample_index": s.sample_index,
                "log_probs": [v + plan.gap(rid) for v in s.rollout_log_probs],
                "ref_log_probs": [v + plan.gap(rid) for v in s.rollout_log_probs],
                "entropy": [plan.entropy(rid)] * s.response_length,
            }
            for s in samples
        ]
        write_table(paths.logprobs(rid), pa.Table.from_pylist(rows), kind="logprobs")
        _record(paths, "rollout", rid, reward_stats(samples, plan.n))
        _record(paths, "rollout", rid, logprob_stats(samples, rows))
        for k in range(plan.steps_per_rollout):
            step = rid * plan.steps_per_rollout + k
            nan = plan.nan_step == (rid, k)
            _record(
                paths,
                "step",
                rid,
                {
                    "train/loss": 0.01,
                    "train/pg_loss": 0.01,
                    "train/ppo_kl": plan.ppo_kl(rid, k),
                    "train/pg_clipfrac": 0.0 if k == 0 else 0.01,
                    "train/train_rollout_logprob_abs_diff": abs(plan.gap(rid)),
                    "train/grad_norm": float("nan") if nan else plan.grad_norm(rid, step),
                    "train/step": step,
                },
                step=step,
            )
        _record(paths, "check", rid, {"check/finite_metrics": 1.0, "check/engines_in_sync": 1.0})
    if plan.rollouts % plan.eval_every == 0:
        _eval(paths, plan.rollouts, plan, tok)
    return run


def _eval(paths: RunPaths, rid: int, plan: Plan, tok) -> None:
    samples = _samples(rid, plan, tok, eval_mode=True)
    write_rollout(paths.eval_rollout(rid), samples, kind="eval")
    _record(paths, "eval", rid, {**eval_stats(samples, ["arith"]), "eval/step": rid})
