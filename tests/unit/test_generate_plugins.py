"""The plug-ins' engine client and slime's generate / rollout function contracts, on a scripted engine: batching,
per-call seeds, stops, the calculator example's loss mask, and what a rollout function must give back."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Callable

import pytest

from engines.base import EngineAnswer, GenerateOutput, GenerateRequest, SamplingParams
from examples.calculator_tool import calculator
from recipes.tiny_arith.tokenizer import build_tokenizer
from rollout import engine_client
from rollout.engine_client import EngineClient, EngineClientError, call_seed
from rollout.plugins import DataSource, PluginError, _call_generate, _rollout_function
from rollout.sample import Sample
from rollout.template import Stops

TOK = build_tokenizer()
EOS = TOK.eos_token_id


class ScriptedEngine:
    """An engine actor stand-in: `reply(prompt text) -> text` is what the model writes; every call is recorded."""

    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply, self.calls = reply, []
        self.generate = self

    def remote(self, requests: list[GenerateRequest], version: int, ctx: dict) -> asyncio.Future:
        self.calls.append(requests)
        outs = []
        for r in requests:
            ids = TOK.encode(self.reply(TOK.decode(list(r.prompt_tokens))), add_special_tokens=False)
            stop = next((i for i, t in enumerate(ids) if t in r.params.stop_token_ids), None)
            ids = ids[: stop + 1] if stop is not None else ids[: r.params.max_new_tokens]
            reason = "stop" if stop is not None else "length"
            outs.append(GenerateOutput(tuple(ids), tuple(-0.25 for _ in ids), reason, version))
        future = asyncio.get_running_loop().create_future()
        future.set_result(EngineAnswer(outs, 0.01))
        return future


def _client(engine: ScriptedEngine, max_len: int | None = None) -> EngineClient:
    return EngineClient([engine], 3, {}, TOK, Stops((EOS,), ()), max_len=max_len)


def _sample(question: str = "23+45", seed: int = 11, **metadata: object) -> Sample:
    prompt = TOK.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return Sample(
        group_index=0,
        index=0,
        prompt=prompt,
        tokens=TOK.encode(prompt, add_special_tokens=False),
        label=str(eval(question)),
        metadata=dict(metadata),
        seed=seed,
    )


PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 12, "no_stop_trim": True}


def _in_sample(client: EngineClient, seed: int, coro_fn: Callable[[], object]) -> object:
    async def go() -> object:
        with client:
            token = engine_client.for_sample(seed, 0)
            try:
                return await coro_fn()  # type: ignore[misc]
            finally:
                engine_client.reset_sample(token)

    return asyncio.run(go())


def test_calls_made_together_are_one_batch_with_per_call_seeds():
    engine = ScriptedEngine(lambda prompt: "7<eos>")
    client = _client(engine)
    ids = TOK.encode("<|user|>1+1=<|assistant|>", add_special_tokens=False)

    async def three() -> list[dict]:
        return await asyncio.gather(
            *(engine_client.generate(None, {"input_ids": ids, "sampling_params": PARAMS}) for _ in range(3))
        )

    outs = _in_sample(client, 5, three)
    assert len(engine.calls) == 1 and [r.seed for r in engine.calls[0]] == [call_seed(5, n) for n in range(3)]
    assert call_seed(5, 0) == 5 and len({call_seed(5, n) for n in range(3)}) == 3
    assert outs[0]["text"] == "7" and outs[0]["meta_info"]["finish_reason"] == {"type": "stop"}
    assert outs[0]["meta_info"]["output_token_logprobs"] == [
        [-0.25, TOK.convert_tokens_to_ids("7"), None],
        [-0.25, EOS, None],
    ]
    assert outs[0]["meta_info"]["weight_version"] == 3


def test_stops_context_and_refusals():
    engine = ScriptedEngine(lambda prompt: "12+34=99")
    client = _client(engine, max_len=12)
    ids = TOK.encode("<|user|>1+1=<|assistant|>", add_special_tokens=False)  # 6 tokens: 6 left of 12

    async def call(params: dict) -> dict:
        return await engine_client.generate(None, {"input_ids": ids, "sampling_params": params})

    out = _in_sample(client, 1, lambda: call({**PARAMS, "stop": ["="]}))
    assert out["text"] == "12+34=" and engine.calls[-1][0].params.stop_token_ids == (
        EOS,
        TOK.convert_tokens_to_ids("="),
    )
    out = _in_sample(client, 1, lambda: call(PARAMS))
    assert (
        engine.calls[-1][0].params.max_new_tokens == 6
        and out["meta_info"]["finish_reason"]["type"] == "length"
    )
    out = _in_sample(client, 1, lambda: call({**PARAMS, "stop": "4="}))  # a longer stop string cuts the text
    assert out["text"] == "12+34="
    with pytest.raises(EngineClientError, match=r"sampling_params \['repetition_penalty'\]: not supported"):
        _in_sample(client, 1, lambda: call({**PARAMS, "repetition_penalty": 1.1}))

    async def outside() -> dict:
        with client:
            return await call(PARAMS)

    with pytest.raises(EngineClientError, match="outside a sample's generate call"):
        asyncio.run(outside())
    with pytest.raises(EngineClientError, match="inside a --custom-generate-function-path"):
        asyncio.run(call(PARAMS))


def _generate(sample: Sample, reply: Callable[[str], str]) -> tuple[Sample, ScriptedEngine]:
    engine = ScriptedEngine(reply)
    out = _in_sample(
        _client(engine),
        sample.seed or 0,
        lambda: _call_generate(calculator.generate, None, sample, PARAMS, False),
    )
    assert isinstance(out, Sample)
    return out, engine


def _spans(sample: Sample) -> list[tuple[str, int]]:
    """The response as (text, loss mask) runs."""
    runs: list[tuple[list[int], int]] = []
    for t, m in zip(sample.response_tokens, sample.loss_mask or [], strict=True):
        if runs and runs[-1][1] == m:
            runs[-1][0].append(t)
        else:
            runs.append(([t], m))
    return [(TOK.decode(ts), m) for ts, m in runs]


def test_calculator_tool_output_is_masked_and_its_log_probs_unused():
    def model(prompt: str) -> str:  # writes the call, then ends its turn once the result is there
        return "<eos>" if prompt.endswith("=68") else "23+45="

    sample, engine = _generate(_sample(), model)
    assert _spans(sample) == [("23+45=", 1), ("68", 0), ("<eos>", 1)]
    assert sample.rollout_log_probs == [-0.25] * 6 + [0.0, 0.0] + [-0.25]
    assert sample.response == "23+45=68" and sample.status is Sample.Status.COMPLETED
    assert asyncio.run(calculator.reward(None, sample)) == 1.0
    assert [r[0].seed for r in engine.calls] == [11, call_seed(11, 1)]  # one engine call per model turn

    first, _ = _generate(_sample(calculator_first=True), lambda p: "<eos>")
    assert _spans(first) == [("=68", 0), ("<eos>", 1)] and asyncio.run(calculator.reward(None, first)) == 1.0

    direct, _ = _generate(_sample(), lambda p: "67<eos>")  # no call: every token is the model's
    assert _spans(direct) == [("67<eos>", 1)] and asyncio.run(calculator.reward(None, direct)) == 0.0

    looping, engine = _generate(
        _sample(), lambda p: "="
    )  # calls stop after MAX_CALLS; the budget still holds
    assert (
        len(engine.calls) == calculator.MAX_CALLS + 1 and looping.response_length <= PARAMS["max_new_tokens"]
    )


def test_generate_must_give_back_one_sample():
    async def two(args, sample, params):
        return [sample, sample]

    async def text(args, sample, params):
        return "68"

    for fn, match in ((two, "returned 2 samples"), (text, "returned str")):
        with pytest.raises(PluginError, match=match):
            asyncio.run(_call_generate(fn, None, _sample(), PARAMS, False))


@pytest.fixture
def rollout_fns(tmp_path, monkeypatch):
    (tmp_path / "myrollout.py").write_text(
        textwrap.dedent("""
        def drops_a_group(args, rollout_id, data_source, evaluation=False):
            return data_source.get_samples(1)

        async def keeps_all(args, rollout_id, data_source, evaluation=False):
            groups = data_source.get_samples(2)
            data_source.add_samples(groups[1:])
            return groups[:1] + data_source.get_samples(1)

        def too_many(args, rollout_id, data_source, evaluation=False):
            return data_source.get_samples(3)
    """)
    )
    monkeypatch.chdir(tmp_path)
    return "myrollout"


def test_rollout_function_must_return_every_sample_once(rollout_fns):
    from config import RunConfig
    from rollout.data import Prompt
    from rollout.requests import build_requests

    prompts = [Prompt(i + 1, f"p{i}", (4, 5), "9", {}, None) for i in range(2)]
    entries = build_requests(prompts, 1, 0, 2, SamplingParams())
    args = RunConfig()
    samples = asyncio.run(_rollout_function(f"{rollout_fns}.keeps_all", args, 0, entries))
    assert [s.index for s in samples] == [0, 1, 2, 3] and samples[2].seed == entries[2].request.seed
    with pytest.raises(PluginError, match=r"returned 2 samples for rollout 0: .* \(missing indices \[2, 3\]"):
        asyncio.run(_rollout_function(f"{rollout_fns}.drops_a_group", args, 0, entries))
    with pytest.raises(PluginError, match="asked for 3 more prompt groups but the rollout has 2 left"):
        asyncio.run(_rollout_function(f"{rollout_fns}.too_many", args, 0, entries))
    assert DataSource([], 0).get_samples(0) == []


def test_plugged_samples_run_the_generate_function_per_entry_and_evals_without_a_rollout_function(tmp_path):
    from config import RunConfig
    from rollout.data import Prompt
    from rollout.plugins import plugged_samples
    from rollout.requests import build_requests
    from rollout.rewards import Scorer

    prompt = TOK.apply_chat_template(
        [{"role": "user", "content": "23+45"}], tokenize=False, add_generation_prompt=True
    )
    ids = tuple(TOK.encode(prompt, add_special_tokens=False))
    entries = build_requests([Prompt(1, prompt, ids, "68", {}, None)], 1, 0, 2, SamplingParams())
    engine = ScriptedEngine(lambda p: "68<eos>")
    scorer = Scorer("exact_match", None, None)

    def run_with(eval_mode: bool, **rollout: str) -> list[Sample]:
        cfg = RunConfig(rollout={"rollout_max_response_len": 6, **rollout})

        async def go() -> list[Sample]:
            with _client(engine) as client:
                return await plugged_samples(cfg, 0, entries, client, scorer, eval_mode=eval_mode)

        return asyncio.run(go())

    samples = run_with(False, custom_generate_function_path="examples.calculator_tool.calculator.generate")
    assert [s.index for s in samples] == [0, 1] and [s.response for s in samples] == ["68", "68"]
    assert [r.seed for r in engine.calls[-1]] == [
        e.request.seed for e in entries
    ]  # one batch, the samples' seeds
    evals = run_with(True, rollout_function_path="examples.rollout_function.rollout.generate_rollout")
    assert [s.response for s in evals] == ["68", "68"] and all(s.loss_mask == [1, 1, 1] for s in evals)


def test_plugin_paths_are_checked_before_the_run(tmp_path, monkeypatch):
    from config import RunConfig
    from rollout.extensions import ExtensionError
    from rollout.plugins import SLIME_DEFAULT_ROLLOUT, check_plugins, uses_plugins

    (tmp_path / "badplug.py").write_text("def two(args, sample):\n    return sample\n")
    monkeypatch.chdir(tmp_path)

    def cfg(**rollout: str) -> RunConfig:
        return RunConfig(rollout=rollout)

    check_plugins(cfg(custom_generate_function_path="examples.calculator_tool.calculator.generate"))
    check_plugins(cfg(rollout_function_path="examples.rollout_function.rollout.generate_rollout"))
    assert not uses_plugins(
        cfg(rollout_function_path=SLIME_DEFAULT_ROLLOUT)
    )  # slime's default: our generation
    with pytest.raises(
        ExtensionError, match="--custom-generate-function-path 'nowhere_xyz.gen': cannot import"
    ):
        check_plugins(cfg(custom_generate_function_path="nowhere_xyz.gen"))
    with pytest.raises(
        ExtensionError, match=r"two\(args, sample\) takes 2 positional arguments; slime calls it"
    ):
        check_plugins(cfg(rollout_function_path="badplug.two"))


def test_a_new_sample_takes_its_entrys_place():
    from rollout.data import Prompt
    from rollout.plugins import _same_place
    from rollout.requests import build_requests

    entry = build_requests([Prompt(1, "p", (4, 5), "9", {}, None)], 1, 0, 2, SamplingParams())[1]
    fresh = _same_place(Sample(prompt="p", tokens=[4, 5]), entry)
    assert (fresh.index, fresh.group_index, fresh.seed) == (1, 0, entry.request.seed)
    with pytest.raises(PluginError, match="gave back sample 1 with group_index 3; it is 0"):
        _same_place(Sample(index=1, group_index=3), entry)
