"""The rollout actor is handed the class of the tokenizer its creator loaded (rollout.data.use_tokenizer_class)
instead of resolving it with `AutoTokenizer`, which imports torch: the process that scores and writes rollouts runs
no model and holds no torch, and it tokenizes as the driver did when it checked the data. What is handed over is
small enough to travel inline with Ray's actor-creation call, never through its object store."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

from rollout.data import loaded_tokenizer_classes, tokenizer_at

ROOT = Path(__file__).resolve().parents[2]

# what a rollout actor imports (its module, the recipes' rewards), then the tokenizer class it is handed
_ACTOR_SIDE = """
import pickle, sys
import rollout.actor, recipes.tiny_arith.reward, recipes.long_arith.reward
from rollout.data import use_tokenizer_class, tokenizer_at

handed = pickle.loads(sys.stdin.buffer.read())
use_tokenizer_class(sys.argv[1], handed[sys.argv[1]])
tok = tokenizer_at(sys.argv[1])
chat = tok.apply_chat_template(
    [{"role": "user", "content": "12+34"}], tokenize=False, add_generation_prompt=True
)
print(repr((type(tok).__name__, len(tok), tok(chat, add_special_tokens=False)["input_ids"], chat,
            "torch" in sys.modules)))
"""


def test_the_handed_class_loads_the_same_tokenizer_and_nothing_imports_torch(base_checkpoint):
    tok = tokenizer_at(base_checkpoint)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "12+34"}], tokenize=False, add_generation_prompt=True
    )
    handed = pickle.dumps(loaded_tokenizer_classes(base_checkpoint))
    # inline in the creation call (Ray's limit is 100 KiB): larger arguments go to its object store, which a
    # restart of the actor then depends on; a pickled tokenizer is 4 KB at this vocabulary, 8 MB at 150k ids
    assert len(handed) < 1024
    done = subprocess.run(
        [sys.executable, "-c", _ACTOR_SIDE, base_checkpoint],
        input=handed,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert got == (type(tok).__name__, len(tok), ids, chat, False)


def test_only_a_tokenizer_already_loaded_here_is_handed_over(base_checkpoint, tmp_path):
    assert loaded_tokenizer_classes(None) == {}
    assert loaded_tokenizer_classes(str(tmp_path / "never-loaded")) == {}  # nothing is loaded to hand over
    tok = tokenizer_at(base_checkpoint)
    assert loaded_tokenizer_classes(base_checkpoint) == {base_checkpoint: type(tok)}


class _OwnCode:
    """Stands in for a tokenizer class of a checkpoint's own code (`trust_remote_code`)."""


_OwnCode.__module__ = "transformers_modules.some_model.tokenization"


def test_a_tokenizer_class_of_a_checkpoints_own_code_is_not_handed_over(monkeypatch):
    from rollout import data

    monkeypatch.setitem(data._TOKENIZERS, "/own-code", _OwnCode())
    assert loaded_tokenizer_classes("/own-code") == {}
