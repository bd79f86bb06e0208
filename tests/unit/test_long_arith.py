"""Unit tests for the long-arith recipe (fast: a tiny injected model, a few warm-up steps)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from recipes.long_arith.data import DIGITS, MAX_RESPONSE_TOKENS, eval_problems, make_problems, solution
from recipes.long_arith.reward import PARTIAL_CREDIT, mean_reward, reward
from recipes.long_arith.settings import WarmupSettings, checkpoint_path
from recipes.long_arith.tokenizer import VOCAB_SIZE, build_tokenizer
from recipes.registry import get_recipe
from rollout.rewards import builtin_reward

# A model and budget small enough to build in a few seconds (the real one takes minutes).
TINY = WarmupSettings(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    steps=2,
    log_every=1,
    batch_size=2,
    val_size=0,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_vocab_layout_and_round_trip(tok):
    vocab = tok.get_vocab()
    assert len(tok) == VOCAB_SIZE == 4096
    assert [vocab[t] for t in ("<pad>", "<eos>", "<|user|>", "<|assistant|>")] == [0, 1, 2, 3]
    assert [vocab[c] for c in "0123456789+=;"] == list(range(4, 17))
    assert vocab["<|reserved_0|>"] == 17 and vocab[f"<|reserved_{VOCAB_SIZE - 18}|>"] == VOCAB_SIZE - 1
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "58+64"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|user|>58+64<|assistant|>"
    text = prompt + solution(58, 64) + "<eos>"
    ids = tok.encode(text)
    assert ids[:3] == [2, vocab["5"], vocab["8"]] and ids[-1] == 1
    assert len(ids) == 2 + len("58+64") + len(solution(58, 64)) + 1  # one token per character
    assert tok.decode(ids) == text
    assert max(tok.encode("0123456789+=;")) < 17  # text never encodes to a reserved id


def test_solution_format():
    assert solution(58, 64) == "8+4+0=12;5+6+1=12;=122"
    assert solution(4821937, 6620154).endswith(f";={4821937 + 6620154}")
    with pytest.raises(ValueError):
        solution(5, 10)


def test_problems_deterministic_split_and_lengths(tok):
    a = make_problems(64, seed=0, split="train")
    assert a == make_problems(64, seed=0, split="train") != make_problems(64, seed=1, split="train")
    lengths = []
    for p in a:
        x, y = p["question"].split("+")
        assert len(x) == len(y) and len(x) in DIGITS and p["label"] == solution(int(x), int(y))
        lengths.append(len(tok.encode(p["label"])) + 1)  # + <eos>
    assert 64 <= min(lengths) and max(lengths) <= MAX_RESPONSE_TOKENS
    for digits, (lo, hi) in ((DIGITS[0], (64, 80)), (DIGITS[-1], (225, MAX_RESPONSE_TOKENS))):
        for p in make_problems(8, seed=0, split="eval", digits=digits):
            assert lo <= len(tok.encode(p["label"])) + 1 <= hi
    train = {p["question"] for p in make_problems(300, seed=0, split="train")}
    assert not train & {p["question"] for p in eval_problems()}
    with pytest.raises(ValueError):
        make_problems(1, 0, "test")


def test_reward_exact_partial_and_wrong():
    label = solution(4821937, 6620154)
    steps = label.split(";")
    assert (
        reward(label, label) == reward(label + "<eos>", label) == reward(f" {label}<eos><pad>", label) == 1.0
    )
    assert builtin_reward("long-arith")(label, label) == 1.0
    # The right steps but a wrong sum: partial credit for every field of every step (7 steps x 4).
    assert reward(";".join(steps[:-1]) + ";=1", label) == pytest.approx(PARTIAL_CREDIT)
    # Three right steps, then one with two right fields (9 and 1 wrong), cut off: 14 of 28 fields.
    wrong = ";".join(steps[:3]) + ";9+9+1=2;"
    assert steps[3] == "1+0+1=2" and reward(wrong, label) == pytest.approx(PARTIAL_CREDIT * 14 / 28)
    # Extra steps count against the response; a step not of the form a+b+c=s scores nothing.
    assert reward(";".join(steps[:-1] * 2) + ";=1", label) == pytest.approx(PARTIAL_CREDIT * 28 / 56)
    assert reward("7+4=11;" + ";".join(steps[1:-1]) + ";=1", label) == pytest.approx(PARTIAL_CREDIT * 24 / 28)
    assert reward("", label) == reward("<eos>", label) == reward("1;2;=3", label) == 0.0
    assert (
        reward(f"{label}<eos>1", label) == PARTIAL_CREDIT
    )  # text after a non-trailing <eos> is not forgiven
    assert mean_reward([label, ""], [label, label]) == 0.5 and mean_reward([], []) == 0.0


def test_recipe_is_registered_and_writes_prompt_files(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLFLOW_CACHE_DIR", str(tmp_path))
    recipe = get_recipe("long-arith")
    assert recipe.rm_type == "long-arith" and recipe.data["input_key"] == "prompt"
    assert recipe.checkpoint_path() == checkpoint_path(tmp_path) and not recipe.checkpoint_path().exists()
    train, evals = recipe.ensure_data()
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 4096 and rows[0]["prompt"][0]["role"] == "user" and ";=" in rows[0]["label"]
    assert len(pq.read_table(evals).to_pylist()) == len(eval_problems())
    assert recipe.ensure_data() == (train, evals)  # written once


def test_ensure_checkpoint_builds_a_tiny_model_once(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipes.long_arith import bootstrap

    path = bootstrap.ensure_checkpoint(tmp_path, TINY, num_threads=1, verbose=False, eval_size=0)
    assert path == checkpoint_path(tmp_path, TINY) and path.name.startswith("long-arith-")
    for name in ["config.json", "model.safetensors", "tokenizer.json", "DONE", "bootstrap_info.json"]:
        assert (path / name).is_file(), name
    info = json.loads((path / "bootstrap_info.json").read_text())
    assert info["steps"] == 2 and info["eval_set_size"] == 0 and info["settings"]["hidden_size"] == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "long-arith.lock"])
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == 4096 and not model.config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(path).encode("<eos>") == [1]
    monkeypatch.setattr(bootstrap, "train_warmup", lambda *a, **k: pytest.fail("retrained"))
    assert bootstrap.ensure_checkpoint(tmp_path, TINY, verbose=False) == path
    assert checkpoint_path(tmp_path) != path  # the model size is part of the key


def test_default_model_size(tok):
    from recipes.long_arith.model import model_config

    config = model_config(len(tok), WarmupSettings())
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (192, 4, 512)
    embed = config.vocab_size * config.hidden_size
    layer = (2 * 192 * 192 + 2 * 192 * 96 + 192 + 2 * 96) + 3 * 192 * 512 + 2 * 192
    assert 2 * embed + 4 * layer + 192 == 3_198_144
