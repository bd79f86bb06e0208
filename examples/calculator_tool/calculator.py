"""A calculator-tool multi-turn task on the tiny-arith recipe: slime's --custom-generate-function-path and a
slime-style --custom-rm-path.

    rollflow run --custom-generate-function-path examples.calculator_tool.calculator.generate \\
        --custom-rm-path examples.calculator_tool.calculator.reward \\
        --prompt-data examples/calculator_tool/prompts.jsonl --input-key prompt --label-key label \\
        --apply-chat-template

The tool protocol fits the tiny model's characters: in its turn the model calls the calculator by writing `=`
(after an expression such as `23+45`, whose value it gets; after anything else, or alone, it gets the question's
value). The generate function
stops the model there, runs the calculator and appends its result (`68`) to the response with loss mask 0:
the tool's tokens are the environment's, not the model's, so the trainer's loss skips them and their rollout
log-probs are placeholders. The model then goes on with its turn (ending it with `<eos>` once the result is its
answer). A prompt row whose metadata says `"calculator_first": true` has the scaffold make the call itself before
the model's turn (`=` and the result both masked), as an agent that always consults the tool would.

The reward scores the model's final answer: the text after the last `=` of the response (the tool's result and
what the model wrote after it), else the whole response.

The warm-up model almost never writes `=`; calls that are rewarded teach it to. It learns to call the tool in a
few dozen rollouts of `--rollout-batch-size 64 --n-samples-per-prompt 8 --lr 1e-3 --lr-decay-style constant
--weight-decay 0 --rollout-shuffle` (tests/e2e/test_generate_plugins.py checks it).
"""

from __future__ import annotations

import re
from typing import Any

from rollout import engine_client
from rollout.sample import Sample

CALL = "="  # the model's tool call
MAX_CALLS = 2  # per sample; a further `=` ends the turn like any stop
_EXPRESSION = re.compile(r"\d+(?:[+-]\d+)+")


def calculate(expression: str) -> str | None:
    """The value of an integer sum/difference such as `23+45-7`; None for anything else."""
    if not _EXPRESSION.fullmatch(expression):
        return None
    terms = re.findall(r"[+-]?\d+", expression)
    return str(sum(int(t) for t in terms))


def _question(sample: Sample) -> str:
    found = _EXPRESSION.search(sample.prompt if isinstance(sample.prompt, str) else str(sample.prompt))
    return found.group(0) if found else ""


def _tool_result(sample: Sample, written: str) -> str:
    """What the calculator answers a call after `written` (the model's text of this turn before `=`)."""
    return calculate(written.strip()) or calculate(_question(sample)) or "0"


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """slime's generate plug-in: the model's turns, with calculator calls answered in between (see the module
    docstring). `max_new_tokens` bounds the whole response, tool tokens included, as in slime's examples."""
    tok = engine_client.tokenizer(args)
    params = {**sampling_params, "stop": [*(sampling_params.get("stop") or []), CALL]}
    budget = int(params["max_new_tokens"])
    calls = 0
    if sample.metadata.get("calculator_first"):
        tool = CALL + _tool_result(sample, "")
        sample.append_response_tokens(
            args, tokens=tok.encode(tool, add_special_tokens=False), trainable=False, text=tool
        )
        calls += 1
    while True:
        left = budget - sample.response_length
        if left <= 0:
            sample.status = Sample.Status.TRUNCATED
            return sample
        payload = {"input_ids": sample.tokens, "sampling_params": {**params, "max_new_tokens": left}}
        out = await engine_client.generate(args, payload)
        pairs = out["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(
            args,
            tokens=[t for _, t, _ in pairs],
            log_probs=[lp for lp, _, _ in pairs],
            meta_info=out["meta_info"],
            text=out["text"],
        )
        if not out["text"].endswith(CALL) or calls >= MAX_CALLS or sample.status is Sample.Status.TRUNCATED:
            return sample
        result = _tool_result(sample, out["text"][: -len(CALL)])
        sample.append_response_tokens(
            args, tokens=tok.encode(result, add_special_tokens=False), trainable=False, text=result
        )
        calls += 1


def final_answer(response: str) -> str:
    """The model's final answer in a response (see the module docstring)."""
    return response.rsplit(CALL, 1)[-1].strip()


async def reward(args: Any, sample: Sample) -> float:
    """1.0 when the final answer is the label, else 0.0 (slime's custom reward signature)."""
    return 1.0 if final_answer(sample.response) == str(sample.label).strip() else 0.0
