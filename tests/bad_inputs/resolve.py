"""Bad inputs checked against the model and the data in flows/resolve.py: the model's limits, the data's types,
fault targets and placement."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.bad_inputs.common import Case, _jsonl, run


def _model(tmp: Path, broken: str = "") -> str:
    """A copy of the tiny-arith model (64 positions) in tmp: whole, without its tokenizer files ("notok"), or with
    config.json / tokenizer.json not JSON ("config.json", "tokenizer.json")."""
    from recipes.tiny_arith.bootstrap import ensure_checkpoint

    d = tmp / f"model-{broken or 'ok'}"
    if not d.is_dir():
        shutil.copytree(ensure_checkpoint(), d)
    if broken == "notok":
        for f in d.glob("tokenizer*"):
            f.unlink()
    if broken.endswith(".json"):
        (d / broken).write_text("{not json\n")
    return str(d)


def _prompts(tmp: Path, rows: list[dict], name: str) -> str:
    return _jsonl(tmp, "".join(json.dumps(r) + "\n" for r in rows), name)


def _own(tmp: Path, *flags: str, rows: list[dict] | None = None, model: str = "") -> list[str]:
    """`rollflow run` on a model and prompt file of the case's own (two "a+b=" prompts with string labels)."""
    rows = rows if rows is not None else [{"input": "1+2=", "label": "3"}, {"input": "2+2=", "label": "4"}]
    data = _prompts(tmp, rows, "own")
    return [
        "run",
        "--run-dir",
        str(tmp / "run"),
        "--hf-checkpoint",
        _model(tmp, model),
        "--prompt-data",
        data,
    ] + list(flags)


def _observe(target: str) -> str:
    return json.dumps(
        [
            {
                "request_id": "f",
                "hook_name": "engine_generate_start"
                if "engine" in target
                else "trainer_step_before_allreduce",
                "target": json.loads(target),
                "action": {"kind": "observe"},
            }
        ]
    )


RESOLVE_CASES: list[Case] = [
    Case(
        "model limit",
        "--rollout-max-response-len 500 on a model with 64 positions",
        lambda tmp: _own(
            tmp, "--rm-type", "math", "--label-key", "label", "--rollout-max-response-len", "500"
        ),
        "--rollout-max-response-len 500: the longest prompt of --prompt-data",
    ),
    Case(
        "model limit",
        "--eval-max-response-len 100 on a model with 64 positions",
        lambda tmp: [
            *_own(tmp, "--rm-type", "math", "--label-key", "label", "--eval-max-response-len", "100"),
            "--eval-prompt-data",
            "e",
            _prompts(tmp, [{"input": "3+3=", "label": "6"}], "eval"),
        ],
        "--eval-max-response-len 100: the longest prompt of --eval-prompt-data e",
    ),
    run(
        "--eval-max-response-len",
        "1e9",
        needle="--eval-max-response-len",
        kind="number",
        what="eval length 1e9",
    ),
    run(
        "--eval-max-response-len",
        "1000000000",
        needle="--eval-max-response-len",
        kind="number",
        what="10^9 eval tokens",
    ),
    run("--seed", str(2**70), needle="--seed", kind="number", what="a 70-bit trainer seed"),
    run("--rollout-seed", "-1", needle="--rollout-seed", kind="number", what="a negative rollout seed"),
    Case(
        "data",
        "labels of the wrong type for the reward",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "tiny-arith",
            "--label-key",
            "label",
            rows=[{"input": "1+2=", "label": "3"}, {"input": "2+2=", "label": 4}],
        ),
        "line 2: --label-key 'label': --rm-type tiny-arith expects a string as the label, got int",
    ),
    Case(
        "data",
        "a built-in reward without --label-key",
        lambda tmp: _own(tmp, "--rm-type", "math"),
        "no --label-key names the row key",
    ),
    Case(
        "data",
        "an empty prompt",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "math",
            "--label-key",
            "label",
            rows=[{"input": "1+2=", "label": "3"}, {"input": "", "label": "0"}],
        ),
        "own.jsonl line 2: --input-key 'input': the prompt '' encodes to no tokens",
    ),
    Case(
        "data",
        "tools that are not JSON",
        lambda tmp: _own(
            tmp,
            "--rm-type",
            "math",
            "--label-key",
            "label",
            "--apply-chat-template",
            rows=[{"input": "1+2=", "label": "3", "tools": "[{oops"}],
        ),
        "own.jsonl line 1: --tool-key 'tools' is a string that is not JSON",
    ),
    run(
        "--ci-fault-hooks",
        _observe('{"engine": 5}'),
        needle="targets engine 5, but the run has 1 engine(s)",
        kind="combination",
        what="a fault for engine 5 of 1",
    ),
    run(
        "--ci-fault-hooks",
        _observe('{"trainer_rank": 2}'),
        "--data-parallel-size",
        "2",
        needle="targets trainer rank 2, but the run has 2 trainer rank(s)",
        kind="combination",
        what="a fault for trainer rank 2 of 2",
    ),
    run(
        "--actor-num-nodes",
        "2",
        "--data-parallel-size",
        "2",
        needle="--actor-num-nodes 2: a local Ray (no --ray-address) has 1 node(s)",
        kind="placement",
        what="trainers over 2 nodes on a local Ray",
    ),
    run(
        "--actor-resources",
        '{"trainer_node": 1}',
        needle="--actor-resources: the run's placement group needs 1 trainer_node",
        kind="placement",
        what="a resource no node of a local Ray has",
    ),
    Case(
        "path",
        "a model dir without tokenizer files",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "notok")],
        "no tokenizer files (none of tokenizer.json",
    ),
    Case(
        "hostile file",
        "a model whose config.json is not JSON",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "config.json")],
        "config.json line 1 column 2: not valid JSON",
    ),
    Case(
        "hostile file",
        "a model whose tokenizer.json is not JSON",
        lambda tmp: ["run", "--run-dir", str(tmp / "run"), "--hf-checkpoint", _model(tmp, "tokenizer.json")],
        "tokenizer.json line 1 column 2: not valid JSON",
    ),
]
