"""Prompt data (slime's flags): reading, rendering, filtering, ordering; stop conditions; the chat-template
check; and every bad input named before work starts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.data import DataError, Keys, load_prompts, prompts_for_rollout
from rollout.template import Stops, check_examples, cut_at_stop_string, end_of_turn, resolve_stops
from tests.byo import CHATML, build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def keys(**kw) -> Keys:
    base = dict(
        input_key="input",
        label_key="label",
        metadata_key="metadata",
        tool_key="tools",
        apply_chat_template=False,
        chat_template_kwargs="{}",
        max_prompt_len=None,
    )
    return Keys(**{**base, **kw})


def jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_with_chat_messages_is_rendered_by_the_template(tmp_path, tok):
    path = jsonl(
        tmp_path / "p.jsonl",
        [{"input": [{"role": "user", "content": "What is 1 plus 2?"}], "label": "3", "metadata": {"id": 7}}],
    )
    s = load_prompts(path, tok, keys(apply_chat_template=True))
    p = s.prompts[0]
    assert p.text == "<|im_start|>user\nWhat is 1 plus 2?<|im_end|>\n<|im_start|>assistant\n"
    assert list(p.tokens) == tok.encode(p.text, add_special_tokens=False)
    assert p.label == "3" and p.metadata == {"id": 7} and p.row == 1


def test_a_string_input_is_used_as_is_or_wrapped_as_one_user_message(tmp_path, tok):
    path = jsonl(tmp_path / "p.jsonl", [{"input": "What is 1 plus 2?", "label": 3}])
    assert load_prompts(path, tok, keys()).prompts[0].text == "What is 1 plus 2?"
    templated = load_prompts(path, tok, keys(apply_chat_template=True)).prompts[0]
    assert templated.text.startswith("<|im_start|>user\nWhat is 1 plus 2?<|im_end|>")


def test_parquet_rows_and_metadata_as_json_text(tmp_path, tok):
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{"q": "a", "y": "1", "meta": json.dumps({"k": 1})}, {"q": "b", "y": "2", "meta": None}]
        ),
        path,
    )
    s = load_prompts(str(path), tok, keys(input_key="q", label_key="y", metadata_key="meta"))
    assert [(p.text, p.label, p.metadata) for p in s.prompts] == [("a", "1", {"k": 1}), ("b", "2", {})]


def test_long_prompts_are_dropped_and_counted(tmp_path, tok):
    path = jsonl(
        tmp_path / "p.jsonl",
        [{"input": "short", "label": "1"}, {"input": "a much longer prompt " * 5, "label": "2"}],
    )
    s = load_prompts(path, tok, keys(max_prompt_len=8))
    assert len(s.prompts) == 1 and s.dropped_long == 1 and s.rows == 2


@pytest.mark.parametrize(
    "rows, kw, needle",
    [
        (['{"input": "a", "label": "1"}', "{not json"], {}, r"p.jsonl line 2: not valid JSON"),
        (["[1, 2]"], {}, r"line 1: expected a JSON object, got list"),
        (
            [{"prompt": "a", "label": "1"}],
            {},
            r"line 1: no key 'input' \(--input-key\); the row has \['label', 'prompt'\]",
        ),
        ([{"input": "a"}], {}, r"line 1: no key 'label' \(--label-key\)"),
        (
            [{"input": [{"role": "user", "content": "a"}], "label": "1"}],
            {},
            r"holds chat messages; add --apply-chat-template",
        ),
        (
            [{"input": [{"content": "a"}], "label": "1"}],
            {"apply_chat_template": True},
            r"message 0 is not a \{role, content\}",
        ),
        ([{"input": 5, "label": "1"}], {}, r"must be a string or a list of chat messages, got int"),
        (
            [{"input": "a", "label": "1", "metadata": [1]}],
            {},
            r"--metadata-key 'metadata' must be a JSON object, got list",
        ),
        (
            [{"input": "a long prompt here", "label": "1"}],
            {"max_prompt_len": 1},
            r"no prompts left: all 1 are longer",
        ),
        ([], {}, r"the file has no rows"),
    ],
)
def test_bad_prompt_files_are_named(tmp_path, tok, rows, kw, needle):
    path = jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DataError, match=needle):
        load_prompts(path, tok, keys(**kw))


def test_missing_and_unsupported_files(tmp_path, tok):
    with pytest.raises(DataError, match="no such file"):
        load_prompts(str(tmp_path / "nope.jsonl"), tok, keys())
    (tmp_path / "p.csv").write_text("input,label\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_prompts(str(tmp_path / "p.csv"), tok, keys())
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_prompts(str(tmp_path / "bad.parquet"), tok, keys())


def test_order_is_file_order_or_a_seeded_per_epoch_permutation(tmp_path, tok):
    path = jsonl(tmp_path / "p.jsonl", [{"input": f"q{i}", "label": str(i)} for i in range(5)])
    prompts = load_prompts(path, tok, keys()).prompts
    plain = [p.label for r in range(3) for p in prompts_for_rollout(prompts, 2, r, seed=42, shuffle=False)]
    assert plain == ["0", "1", "2", "3", "4", "0"]  # epochs roll over
    shuffled = [
        [p.label for p in prompts_for_rollout(prompts, 5, r, seed=42, shuffle=True)] for r in range(2)
    ]
    assert sorted(shuffled[0]) == sorted(shuffled[1]) == ["0", "1", "2", "3", "4"]
    assert shuffled[0] != shuffled[1]  # a new permutation per epoch
    assert shuffled == [
        [p.label for p in prompts_for_rollout(prompts, 5, r, seed=42, shuffle=True)] for r in range(2)
    ]


# -- stops -------------------------------------------------------------------------------------------------
def test_default_stops_are_eos_and_the_templates_end_of_turn(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn(tok) == im_end
    stops = resolve_stops(tok, None, None, None)
    assert stops.ids == (tok.eos_token_id, im_end) and stops.strings == ()


def test_single_token_stop_strings_become_ids_and_longer_ones_are_text(tok):
    stops = resolve_stops(tok, None, ["<|im_start|>", "plus 2"], [5])
    assert tok.convert_tokens_to_ids("<|im_start|>") in stops.ids and 5 in stops.ids
    assert stops.strings == ("plus 2",)
    with pytest.raises(ValueError, match="empty stop string"):
        resolve_stops(tok, None, [""], None)
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        resolve_stops(tok, None, None, [10**6])


def test_cut_at_stop_string(tok):
    tokens = tok.encode("What is 1 plus 2? Then more", add_special_tokens=False)
    n = cut_at_stop_string(tokens, tok, ("plus 2",))
    assert n is not None and tok.decode(tokens[:n]).endswith("plus 2")
    assert "plus 2" not in tok.decode(tokens[: n - 1])
    assert cut_at_stop_string(tokens, tok, ("absent",)) is None


# -- the chat-template check ---------------------------------------------------------------------------------
def test_template_check_passes_on_chatml(tok):
    stops = resolve_stops(tok, None, None, None)
    [check] = check_examples(tok, [([{"role": "user", "content": "What is 1 plus 2?"}], "3")], stops)
    assert check.problems == []
    masked = [t for t, m in zip(check.full_ids, check.mask, strict=True) if m]
    assert tok.decode(masked) == "3<|im_end|>"  # exactly the assistant's tokens and its end-of-turn


def test_template_check_names_the_first_differing_token():
    planted = CHATML.replace(
        "<|im_start|>{{ m['role'] }}\n", "<|im_start|>{{ m['role'] }}:\n"
    )  # turns get a colon
    tok = build_tokenizer(planted)
    stops = resolve_stops(tok, None, None, None)
    [check] = check_examples(tok, [([{"role": "user", "content": "What is 1 plus 2?"}], "3")], stops)
    assert len(check.problems) == 1 and "the generation prompt is not a prefix" in check.problems[0]
    assert check.problems[0].startswith("token ")


def test_template_check_catches_an_end_of_turn_that_is_not_a_stop(tok):
    stops = Stops(ids=(tok.eos_token_id,), strings=())  # <|im_end|> left out
    [check] = check_examples(tok, [([{"role": "user", "content": "hi"}], "3")], stops)
    assert "'<|im_end|>'" in check.problems[0] and "not a stop id" in check.problems[0]


@pytest.mark.parametrize("recipe", ["tiny-arith", "long-arith"])
def test_the_end_of_turn_of_a_freshly_built_recipe_tokenizer_is_found(recipe):
    # a dry run on an empty cache reads the tokenizer as built, whose word-level vocabulary has no unknown token
    from recipes.registry import get_recipe

    tok = get_recipe(recipe).tokenizer()
    eot = end_of_turn(tok)
    assert eot is not None and eot in tok.all_special_ids + list(tok.added_tokens_decoder)
