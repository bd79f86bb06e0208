"""Unit tests for the tiny-arith recipe (fast: no full warm-up training)."""

from __future__ import annotations

import fcntl
import json
import pathlib
import subprocess
import sys
import threading

import pytest
import torch

from recipes.tiny_arith import bootstrap
from recipes.tiny_arith.bootstrap import WarmupSettings, ensure_checkpoint, sample_accuracy
from recipes.tiny_arith.data import (
    all_problems,
    eval_problems,
    format_prompt,
    make_problems,
)
from recipes.tiny_arith.model import build_model, model_config
from recipes.tiny_arith.reward import accuracy, reward
from recipes.tiny_arith.tokenizer import build_tokenizer, tokenizer_fingerprint

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# A budget small enough to train in about a second.
TINY = WarmupSettings(steps=4, log_every=2, batch_size=8, val_size=16)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


# --- tokenizer ----------------------------------------------------------------------


def test_vocab_layout(tok):
    vocab = tok.get_vocab()
    assert vocab["<pad>"] == 0 and vocab["<eos>"] == 1
    assert vocab["<|user|>"] == 2 and vocab["<|assistant|>"] == 3
    assert [vocab[c] for c in "0123456789+-= "] == list(range(4, 18))
    assert len(tok) == 18
    assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>"


def test_chat_template_exact(tok):
    text = tok.apply_chat_template(
        [{"role": "user", "content": "23+45"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|user|>23+45=<|assistant|>"
    assert format_prompt(tok, "23+45") == text


def test_special_tokens_are_single_ids_and_nothing_is_added(tok):
    ids = tok.encode("<|user|>23+45=<|assistant|>")
    # <|user|> 2 3 + 4 5 = <|assistant|>
    assert ids == [2, 6, 7, 14, 8, 9, 16, 3]
    assert tok.encode("<eos>") == [1]
    assert tok.encode("12") == [5, 6]  # no BOS/EOS added automatically


def test_round_trip(tok):
    for text in ["<|user|>99+10=<|assistant|>109<eos>", "1 2-3", "0123456789+-= "]:
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|user|>1+2=<|assistant|>3<eos>")
    assert tok.decode(ids, skip_special_tokens=True) == "1+2=3"


def test_fingerprint_stable_across_processes_and_save(tok, tmp_path):
    code = (
        "from recipes.tiny_arith.tokenizer import build_tokenizer, tokenizer_fingerprint;"
        "print(tokenizer_fingerprint(build_tokenizer()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == tokenizer_fingerprint(tok)
    assert len(tokenizer_fingerprint(tok)) == 64

    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tok)
    assert reloaded.encode("<|user|>23+45=<|assistant|>") == tok.encode("<|user|>23+45=<|assistant|>")


# --- data ---------------------------------------------------------------------------


def test_problems_deterministic_and_well_formed():
    a = make_problems(50, seed=3, split="train")
    assert a == make_problems(50, seed=3, split="train")
    assert a != make_problems(50, seed=4, split="train")
    for p in a:
        x, y = (int(v) for v in p["question"].split("+"))
        assert 10 <= x <= 99 and 10 <= y <= 99
        assert p["label"] == str(x + y) and len(p["label"]) <= 3
    assert len({p["question"] for p in a}) == 50  # distinct while n <= pool size


def test_train_eval_disjoint():
    train = {p["question"] for p in all_problems("train")}
    evals = {p["question"] for p in all_problems("eval")}
    assert not train & evals
    assert len(train) + len(evals) == 90 * 90
    assert 0.05 < len(evals) / (90 * 90) < 0.15
    assert {p["question"] for p in make_problems(500, seed=0, split="eval")} <= evals
    assert {p["question"] for p in make_problems(500, seed=0, split="train")} <= train


def test_eval_set_is_the_whole_eval_split():
    first = eval_problems()
    assert first == eval_problems() == all_problems("eval")
    assert len({p["question"] for p in first}) == len(first) == 793


def test_bad_split_rejected():
    with pytest.raises(ValueError):
        make_problems(1, 0, "test")


# --- reward -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("68", 1.0),
        ("68<eos>", 1.0),
        (" 68 \n", 1.0),
        ("68<eos><pad><pad>", 1.0),
        ("680", 0.0),
        ("6", 0.0),
        ("", 0.0),
        ("<eos>", 0.0),
        ("68<eos>1", 0.0),
        ("068", 0.0),
    ],
)
def test_reward_exact_match(response, expected):
    assert reward(response, "68") == expected


def test_accuracy():
    assert accuracy(["68", "1", "109<eos>"], ["68", "2", "109"]) == pytest.approx(2 / 3)
    assert accuracy([], []) == 0.0
    with pytest.raises(ValueError):
        accuracy(["1"], [])


# --- model --------------------------------------------------------------------------


def test_model_size_and_determinism(tok):
    config = model_config(len(tok))
    assert config.pad_token_id == tok.pad_token_id and config.eos_token_id == tok.eos_token_id
    assert config.tie_word_embeddings
    m1, m2 = build_model(config, seed=0), build_model(config, seed=0)
    n_params = sum(p.numel() for p in m1.parameters())
    assert 200_000 <= n_params <= 500_000
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2)
    m3 = build_model(config, seed=1)
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)


def test_sample_accuracy_runs_and_is_seeded(tok):
    model = build_model(model_config(len(tok)), seed=0)
    problems = make_problems(8, seed=0, split="train")
    rng_before = torch.get_rng_state()
    a = sample_accuracy(model, tok, problems, temperature=1.0, seed=5)
    b = sample_accuracy(model, tok, problems, temperature=1.0, seed=5)
    assert a == b and 0.0 <= a <= 1.0
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert 0.0 <= sample_accuracy(model, tok, problems, temperature=0.0, seed=0) <= 1.0


# --- bootstrap ----------------------------------------------------------------------


def test_ensure_checkpoint_builds_once(tmp_path, monkeypatch):
    calls = []
    real_train = bootstrap.train_warmup

    def counting_train(*args, **kwargs):
        calls.append(1)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(bootstrap, "train_warmup", counting_train)
    threads_before = torch.get_num_threads()

    path = ensure_checkpoint(tmp_path, TINY, num_threads=1, verbose=False)
    assert calls == [1]
    assert torch.get_num_threads() == threads_before
    assert path.parent == tmp_path and path.name.startswith("tiny-arith-")
    for name in ["config.json", "model.safetensors", "tokenizer.json", "DONE", "bootstrap_info.json"]:
        assert (path / name).is_file(), name
    info = json.loads((path / "bootstrap_info.json").read_text())
    assert info["steps"] == TINY.steps
    # No temp build directories are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, "tiny-arith.lock"])

    assert ensure_checkpoint(tmp_path, TINY, num_threads=1, verbose=False) == path
    assert calls == [1]

    # The checkpoint loads with plain HF APIs.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path)
    reloaded_tok = AutoTokenizer.from_pretrained(path)
    assert reloaded_tok.encode("<eos>") == [1]
    assert model.config.vocab_size == 18


def test_cache_dir_from_env_and_settings_in_key(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLFLOW_CACHE_DIR", str(tmp_path))
    assert bootstrap.default_cache_dir() == tmp_path
    tok = build_tokenizer()
    assert bootstrap.recipe_fingerprint(TINY, tok) == bootstrap.recipe_fingerprint(TINY, tok)
    assert bootstrap.recipe_fingerprint(TINY, tok) != bootstrap.recipe_fingerprint(WarmupSettings(), tok)
    # A finished checkpoint is returned as-is without training.
    done = tmp_path / f"tiny-arith-{bootstrap.recipe_fingerprint(TINY, tok)}"
    done.mkdir()
    (done / "DONE").write_text("x\n")
    monkeypatch.setattr(bootstrap, "train_warmup", lambda *a, **k: pytest.fail("retrained"))
    assert ensure_checkpoint(settings=TINY) == done


def test_waits_for_lock_and_reuses_the_winners_build(tmp_path, monkeypatch):
    """A caller blocked on the lock must not train if the holder published meanwhile."""
    monkeypatch.setattr(bootstrap, "train_warmup", lambda *a, **k: pytest.fail("retrained"))
    tok = build_tokenizer()
    final = tmp_path / f"tiny-arith-{bootstrap.recipe_fingerprint(TINY, tok)}"
    result: list[pathlib.Path] = []

    with open(tmp_path / "tiny-arith.lock", "a+") as lock:
        # flock locks belong to the open file description, so this blocks the thread
        # below exactly as another process holding the lock would.
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = threading.Thread(
            target=lambda: result.append(ensure_checkpoint(tmp_path, TINY, verbose=False))
        )
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive()  # still waiting for the lock
        final.mkdir()  # the "other process" publishes its finished build
        (final / "DONE").write_text("x\n")
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(timeout=30)
    assert result == [final]


def test_a_built_checkpoint_is_found_without_importing_the_model_code(base_checkpoint):
    """A run's driver resolves the recipe's checkpoint on every start: once it is built, the build's code
    (transformers' model classes, torch.compile's and sympy's modules, ~0.1 GiB) stays out of that process."""
    code = (
        "import sys\n"
        "from recipes.registry import get_recipe\n"
        "print(get_recipe('tiny-arith').built_checkpoint())\n"
        "print('transformers.modeling_utils' in sys.modules, 'sympy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [base_checkpoint, "False False"]
