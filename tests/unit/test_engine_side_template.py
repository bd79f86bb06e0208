"""`rollflow check-template` checks the engine's side too: the prompt tokens the run's prompt pipeline gives the
engine against the trainer's rendering and tokenization of the same messages."""

from __future__ import annotations

import pytest

import flows.template_cmd
from flows.cli import main
from rollout.data import tokenizer_at
from tests.byo import CHATML, build_model_dir, write_prompts


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo_engine_side")
    return {
        "model": str(build_model_dir(root / "model")),
        "data": str(write_prompts(root / "train.jsonl", 3)),
    }


def _check(byo) -> int:
    return main(
        [
            "check-template",
            "--hf-checkpoint",
            byo["model"],
            "--prompt-data",
            byo["data"],
            "--input-key",
            "messages",
        ]
    )


def test_a_template_that_differs_on_the_engine_side_is_named(byo, tmp_path, monkeypatch, capsys):
    assert _check(byo) == 0
    assert "rollflow check-template: ok (3 example(s))" in capsys.readouterr().out
    # the planted fault: the engine's prompts rendered by another chat template than the trainer's
    other = tokenizer_at(
        str(build_model_dir(tmp_path / "engine", CHATML.replace("assistant\n{% endif", "bot\n{% endif")))
    )
    load = flows.template_cmd.load_prompts
    monkeypatch.setattr(flows.template_cmd, "load_prompts", lambda path, tok, keys: load(path, other, keys))
    assert _check(byo) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        "rollflow check-template: MISMATCH: token 42: the engine is given 'b' (id 68) but the trainer's "
        "rendering and tokenization give 'assistant' (id 285) (46 vs 44 prompt tokens): the rendered prompt text "
        "differs: the chat template (or its kwargs) on the engine's side differs"
    )


def test_the_same_text_tokenized_otherwise_on_the_engine_side_names_the_tokenizer(byo):
    from rollout.template import Stops, check_example, engine_side_problem

    tok = tokenizer_at(byo["model"])
    check = check_example(tok, [{"role": "user", "content": "What is 1 plus 2?"}], "3", Stops((0,), ()))
    assert engine_side_problem(tok, check.prompt_text, list(check.prompt_ids), check) is None
    # the planted fault: the engine side's tokenizer splits the first token in two
    planted = [check.prompt_ids[0], *check.prompt_ids]
    assert engine_side_problem(tok, check.prompt_text, planted, check) == (
        f"token 1: the engine is given {tok.convert_ids_to_tokens(check.prompt_ids[0])!r} (id {check.prompt_ids[0]}) "
        f"but the trainer's rendering and tokenization give {tok.convert_ids_to_tokens(check.prompt_ids[1])!r} "
        f"(id {check.prompt_ids[1]}) ({len(planted)} vs {len(planted) - 1} prompt tokens): same rendered text, other "
        "token ids: the tokenizer on the engine's side differs"
    )
