"""The rollout actor is handed the tokenizer its creator loaded (rollout.data.keep_tokenizer) instead of
loading it with `AutoTokenizer`, which imports torch: the process that scores and writes rollouts runs no
model and holds no torch, and its tokenizer is the one the driver checked the data with."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

from rollout.data import loaded_tokenizers, tokenizer_at

ROOT = Path(__file__).resolve().parents[2]

# what a rollout actor imports (its module, the recipes' rewards), then the tokenizer it is handed
_ACTOR_SIDE = """
import pickle, sys
import rollout.actor, recipes.tiny_arith.reward, recipes.long_arith.reward
from rollout.data import keep_tokenizer, tokenizer_at

handed = pickle.loads(sys.stdin.buffer.read())
keep_tokenizer(sys.argv[1], handed)
tok = tokenizer_at(sys.argv[1])
chat = tok.apply_chat_template(
    [{"role": "user", "content": "12+34"}], tokenize=False, add_generation_prompt=True
)
print(repr((tok is handed, type(tok).__name__, tok(chat, add_special_tokens=False)["input_ids"], chat,
            "torch" in sys.modules)))
"""


def test_a_handed_over_tokenizer_is_the_one_used_and_nothing_imports_torch(base_checkpoint):
    tok = tokenizer_at(base_checkpoint)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "12+34"}], tokenize=False, add_generation_prompt=True
    )
    done = subprocess.run(
        [sys.executable, "-c", _ACTOR_SIDE, base_checkpoint],
        input=pickle.dumps(tok),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert got == (True, type(tok).__name__, ids, chat, False)


def test_only_a_tokenizer_already_loaded_here_is_handed_over(base_checkpoint, tmp_path):
    assert loaded_tokenizers(None) == {}
    assert loaded_tokenizers(str(tmp_path / "never-loaded")) == {}  # nothing is loaded to hand it over
    tok = tokenizer_at(base_checkpoint)
    assert loaded_tokenizers(base_checkpoint) == {base_checkpoint: tok}


class _OwnCode:
    """Stands in for a tokenizer class of a checkpoint's own code (`trust_remote_code`)."""


_OwnCode.__module__ = "transformers_modules.some_model.tokenization"


def test_a_tokenizer_of_a_checkpoints_own_code_or_that_does_not_pickle_is_not_handed_over(monkeypatch):
    from rollout import data

    monkeypatch.setitem(data._TOKENIZERS, "/own-code", _OwnCode())
    assert loaded_tokenizers("/own-code") == {}
    unpicklable = type("Fast", (), {"__module__": "transformers.tokenization_x", "hook": lambda self: None})()
    unpicklable.hook = lambda: None  # a lambda on the instance does not pickle
    monkeypatch.setitem(data._TOKENIZERS, "/no-pickle", unpicklable)
    assert loaded_tokenizers("/no-pickle") == {}
