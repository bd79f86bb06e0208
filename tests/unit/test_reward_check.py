"""`rollflow run --dry-run` calls the reward on a few rows and names a broken one (raises, NaN, text, None) in one
line with the reward, the row and what it returned, before anything starts."""

from __future__ import annotations

import json
import textwrap

import pytest

from flows.cli import main
from tests.byo import build_model_dir, write_prompts

BAD_REWARDS = textwrap.dedent("""
    import math

    def raises_on_row_3(response, label, metadata):
        if metadata["k"] == 2:
            raise KeyError("difficulty")
        return 1.0

    def nan(response, label):
        return math.nan

    def text(response, label):
        return "correct"

    def nothing(response, label):
        pass

    async def slime_style(args, sample):
        return float(sample.response == sample.label and sample.response_length > 0)

    def dict_without_key(response, label):
        return {"score": 1.0}
""")


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo")
    (root / "bad_rewards.py").write_text(BAD_REWARDS)
    return {
        "model": str(build_model_dir(root / "model")),
        "data": str(write_prompts(root / "train.jsonl", 12)),
        "root": root,
    }


def dry_run(byo, tmp_path, monkeypatch, *reward: str) -> int:
    monkeypatch.syspath_prepend(str(byo["root"]))
    argv = ["run", "--dry-run", "--hf-checkpoint", byo["model"], "--prompt-data", byo["data"]]
    argv += [
        "--input-key",
        "messages",
        "--apply-chat-template",
        "--label-key",
        "answer",
        "--metadata-key",
        "info",
    ]
    return main([*argv, *reward, "--run-dir", str(tmp_path / "run")])


@pytest.mark.parametrize(
    "fn, said",
    [
        (
            "raises_on_row_3",
            "line 3 (label '6', response '6'): reward bad_rewards.raises_on_row_3 raised KeyError: ",
        ),
        (
            "nan",
            "line 1 (label '0', response '0'): reward bad_rewards.nan returned nan (float), expected a finite",
        ),
        (
            "text",
            "line 1 (label '0', response '0'): reward bad_rewards.text returned 'correct' (str), expected",
        ),
        (
            "nothing",
            "line 1 (label '0', response '0'): reward bad_rewards.nothing returned None (NoneType), expected",
        ),
        (
            "dict_without_key",
            "reward bad_rewards.dict_without_key returned a dict for sample 0 (keys ['score'])",
        ),
    ],
)
def test_a_broken_reward_is_named_with_its_row_before_anything_starts(
    byo, tmp_path, monkeypatch, capsys, fn, said
):
    assert dry_run(byo, tmp_path, monkeypatch, "--custom-rm-path", f"bad_rewards.{fn}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rollflow: error: --prompt-data {byo['data']} line ")
    assert said in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "reward, line",
    [
        (
            ["--custom-rm-path", "bad_rewards.slime_style"],
            "bad_rewards.slime_style on 4 lines of --prompt-data, each answered by its label: 1, 1, 1, 1",
        ),
        (["--rm-type", "math"], "math on 4 lines of --prompt-data, each answered by its label: 1, 1, 1, 1"),
        (
            ["--rm-type", "dapo", "--reward-key", "score"],
            "dapo on 4 lines of --prompt-data, each answered by its label: 1, 1, 1, 1",
        ),
        (["--rm-type", "f1"], "f1 on 4 lines of --prompt-data, each answered by its label: 1, 1, 1, 1"),
        (["--rm-type", "deepscaler"], "deepscaler on 4 lines"),
    ],
)
def test_a_working_reward_prints_its_rewards_on_the_first_rows(
    byo, tmp_path, monkeypatch, capsys, reward, line
):
    assert dry_run(byo, tmp_path, monkeypatch, *reward) == 0
    assert f"reward check: {line}" in capsys.readouterr().out


def test_a_rule_the_labels_never_satisfy_is_pointed_out(byo, tmp_path, monkeypatch, capsys):
    """gpqa takes any label; a --label-key naming the wrong column gives it nothing to match."""
    assert dry_run(byo, tmp_path, monkeypatch, "--rm-type", "gpqa", "--label-key", "info") == 0
    out = capsys.readouterr().out
    assert "label: 0, 0, 0, 0 (the labels themselves never scored above 0: is --rm-type gpqa the rule" in out


def test_a_reward_server_that_is_not_there_is_named(byo, tmp_path, monkeypatch, capsys):
    url = "http://127.0.0.1:9/reward"
    reward = ["--rm-type", "remote_rm", "--rm-url", url, "--rm-timeout", "0.5"]
    assert dry_run(byo, tmp_path, monkeypatch, *reward) == 2
    err = capsys.readouterr().err
    assert (
        f"line 1 (label '0', response '0'): reward remote_rm raised RemoteRewardError: remote_rm POST {url}: "
        in err
    )


def test_a_remote_rm_probe_without_rm_timeout_waits_a_bounded_time(byo, tmp_path, monkeypatch, capsys):
    """A run gives remote_rm slime's 10 attempts of up to 120 s; the dry run's probe gives up sooner, and says so."""
    monkeypatch.setattr("rollout.reward_check.REMOTE_SECONDS", 0.5)
    url = "http://127.0.0.1:9/reward"
    assert dry_run(byo, tmp_path, monkeypatch, "--rm-type", "remote_rm", "--rm-url", url) == 2
    err = capsys.readouterr().err
    assert f"raised RemoteRewardError: remote_rm POST {url}: " in err and "bounded to 0.5 s)" in err
    assert err.rstrip().endswith(
        "(a dry run waits 0.5 s for a remote_rm sample; a run waits as slime does, 120 s an attempt, up to 10 "
        "attempts, or --rm-timeout)"
    )


def test_a_rows_unknown_rm_type_is_named_before_the_run(byo, tmp_path, monkeypatch, capsys):
    """A row's metadata rm_type (slime's per-sample rule) must name a built-in."""
    rows = [
        {"messages": [{"role": "user", "content": "1+1?"}], "answer": "2", "info": {"rm_type": r}}
        for r in ("f1", "mathh")
    ]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setitem(byo, "data", str(data))
    assert dry_run(byo, tmp_path, monkeypatch, "--rm-type", "math") == 2
    err = capsys.readouterr().err
    assert f"--prompt-data {data} line 2: metadata --rm-type 'mathh': unknown; built-ins are" in err


def test_a_tokenizer_that_cannot_spell_the_answer_does_not_stop_the_check():
    from rollout.data import Prompt, PromptSet
    from rollout.reward_check import check_reward
    from rollout.rewards import Scorer

    class NoUnknownToken:
        def encode(self, text, add_special_tokens=False):
            raise Exception("WordLevel error: Missing [UNK] token from the vocabulary")

    prompts = PromptSet("d.parquet", "0" * 64, (Prompt(1, "1+1=", (5, 6), "2", {}, None),), 1, 0)
    line = check_reward(Scorer("math", None, None), prompts, "--prompt-data", NoUnknownToken(), "math", False)
    assert line == "reward check: math on 1 row of --prompt-data, each answered by its label: 1"
