"""The YAML loader every user-given YAML goes through (config/yaml_file.py): duplicate keys, alias bombs and huge
documents are refused with the line named, and what a refusal quotes is bounded."""

from __future__ import annotations

import argparse
import time

import pytest
import yaml

from config import load_yaml
from config.yaml_file import MAX_YAML_BYTES, bounded, describe_error, loads
from flows.cli import build_config
from tests.bad_inputs import ALIAS_BOMB, WIDE_ALIASES


def _refusal(text: str) -> str:
    with pytest.raises(yaml.YAMLError) as e:
        loads(text)
    return describe_error(e.value)


def test_plain_documents_load_as_safe_load_loads_them():
    text = "rollout: {num_rollout: 2}\ntrain:\n  lr: 1.0e-3\n  betas: [0.9, 0.99]\nname: x\n"
    assert loads(text) == yaml.safe_load(text)


def test_anchors_and_merges_within_the_bounds_still_work():
    text = "base: &b {lr: 1, eps: 2}\ntrain: {<<: *b, lr: 3}\nsame: *b\n"
    assert loads(text) == {
        "base": {"lr": 1, "eps": 2},
        "train": {"lr": 3, "eps": 2},
        "same": {"lr": 1, "eps": 2},
    }


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        (
            "rollout: {a: 1}\ntrain: {}\nrollout: {b: 2}\n",
            " at line 3 column 1: duplicate key 'rollout' (first at line 1)",
        ),
        ("train:\n  lr: 1\n  lr: 2\n", " at line 3 column 3: duplicate key 'lr' (first at line 2)"),
        ("{a: 1, a: 2}\n", " at line 1 column 8: duplicate key 'a' (first at line 1)"),
        ("a: &a [*a]\n", " at line 1 column 8: alias *a refers to a value that contains it"),
    ],
)
def test_duplicate_keys_and_recursive_aliases_name_their_line(text, refusal):
    assert _refusal(text) == refusal


def test_an_alias_bomb_is_refused_in_milliseconds_at_its_line():
    began = time.monotonic()
    refusal = _refusal(ALIAS_BOMB)  # 9^9 values once expanded: safe_load builds it, walking it never ends
    assert time.monotonic() - began < 5
    assert refusal.startswith(" at line 7 column 5") and "aliases expand this value past" in refusal
    assert "past" in _refusal(WIDE_ALIASES)  # few aliases, long strings
    assert _refusal("a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n").endswith("more than 100 aliases")


def test_a_file_over_the_size_bound_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("[" * (MAX_YAML_BYTES + 1))  # would nest a million deep if parsed
    with pytest.raises(ValueError, match=rf"^--config {path}: {MAX_YAML_BYTES + 1} bytes, more than the"):
        load_yaml(path)
    with pytest.raises(yaml.YAMLError, match="characters, more than"):
        loads("x" * (MAX_YAML_BYTES + 1))


def test_load_yaml_names_the_file_line_and_problem_in_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout: {num_rollout: 2}\nrollout: {num_rollout: 3}\n")
    with pytest.raises(ValueError) as e:
        load_yaml(path)
    assert str(e.value) == (
        f"--config {path}: not valid YAML at line 2 column 1: duplicate key 'rollout' (first at line 1)"
    )
    with pytest.raises(ValueError, match=rf"^{path} of the run: not valid YAML at line 2"):
        load_yaml(path, f"{path} of the run")
    path.write_text("")
    assert load_yaml(path) == {}


def test_bounded_marks_what_it_cut():
    assert bounded("abc") == "abc"
    assert bounded("x" * 250) == "x" * 200 + "... (250 characters)"


def test_a_refused_value_is_quoted_bounded(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(f"rollout: {{num_rollout: {'7' * 50_000}x}}\nzz: [{', '.join(['abcdefgh'] * 9000)}]\n")
    with pytest.raises(ValueError) as e:
        build_config(argparse.Namespace(config=str(path)))
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:300]
    assert "... (50003 characters))" in message and "--zz" in message
