"""`rollflow run --dry-run` calls every plug-in that needs no engine on probe samples of the run's data (--group-rm
reward, dynamic sampling filter, buffer filter, custom loss) through the function the run calls it with, and names
one that raises or returns the wrong type in one line, before anything starts; the generation plug-ins are said to
be left uncalled."""

from __future__ import annotations

import textwrap

import pytest

from flows.cli import main
from tests.byo import build_model_dir, write_prompts

PLUGINS = textwrap.dedent("""
    import math

    import torch

    from rollout.dynamic import DynamicFilterOutput


    async def group_ok(args, samples):
        return [float(s.response == s.label) for s in samples]

    def group_raises(args, samples):
        raise KeyError("judge")

    def group_short(args, samples):
        return [1.0] * (len(samples) - 1)

    def group_nan(args, samples):
        return [math.nan] * len(samples)

    def group_text(args, samples):
        return "all good"


    def filter_ok(args, samples, **kwargs):
        return DynamicFilterOutput(keep=len({s.reward for s in samples}) > 1, reason="same")

    def filter_bool(args, samples):
        return True

    def filter_raises(args, samples):
        return samples[0].metadata["difficulty"]

    def filter_text(args, samples):
        return "keep"


    def buffer_ok(args, rollout_id, buffer, num_samples):
        taken = buffer[-num_samples:]
        del buffer[-num_samples:]
        return taken

    def buffer_all(args, rollout_id, buffer, num_samples):
        return list(buffer)

    def buffer_dict(args, rollout_id, buffer, num_samples):
        return {"groups": buffer[:num_samples]}

    def buffer_raises(args, rollout_id, buffer, num_samples):
        raise IndexError("empty")

    def buffer_text(args, rollout_id, buffer, num_samples):
        return [["a sample"]]


    def loss_ok(args, batch, logits, sum_of_sample_mean):
        lp = torch.log_softmax(logits, -1).amax(-1)
        per_token = torch.cat([lp[b, :n] for b, n in enumerate(batch["response_lengths"])])
        loss = -sum_of_sample_mean(per_token)
        return loss, {"pg_loss": loss.detach()}

    def loss_raises(args, batch, logits, sum_of_sample_mean):
        return batch["values"]

    def loss_tensor_only(args, batch, logits, sum_of_sample_mean):
        return logits.mean()

    def loss_float(args, batch, logits, sum_of_sample_mean):
        return 0.5, {}

    def loss_detached(args, batch, logits, sum_of_sample_mean):
        return torch.tensor(1.0, requires_grad=True), {}

    def loss_nan(args, batch, logits, sum_of_sample_mean):
        return logits.sum() * math.nan, {}

    def loss_vector_metric(args, batch, logits, sum_of_sample_mean):
        return logits.mean(), {"per_token": logits.detach().mean(-1)}
""")


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    root = tmp_path_factory.mktemp("byo")
    (root / "plugs.py").write_text(PLUGINS)
    return {
        "model": str(build_model_dir(root / "model")),
        "data": str(write_prompts(root / "train.jsonl", 12)),
        "root": root,
    }


def dry_run(byo, tmp_path, monkeypatch, *flags: str) -> int:
    monkeypatch.syspath_prepend(str(byo["root"]))
    argv = ["run", "--dry-run", "--hf-checkpoint", byo["model"], "--prompt-data", byo["data"]]
    argv += ["--input-key", "messages", "--apply-chat-template", "--label-key", "answer"]
    argv += ["--n-samples-per-prompt", "4", "--rollout-batch-size", "2", "--global-batch-size", "8"]
    return main([*argv, *flags, "--run-dir", str(tmp_path / "run")])


GROUP = "--custom-rm-path plugs.{} --group-rm"
FILTER = "--rm-type exact_match --dynamic-sampling-filter-path plugs.{}"
BUFFER = (
    "--rm-type exact_match --rollout-function-path examples.buffer_filter.retry.generate_rollout "
    "--buffer-filter-path plugs.{}"
)
LOSS = "--rm-type exact_match --loss-type custom_loss --custom-loss-function-path plugs.{}"
PROBE_GROUP = "a group of 4 samples of --prompt-data {data} line 1 (label '0', response '0')"


@pytest.mark.parametrize(
    "flags, fn, said",
    [
        (GROUP, "group_raises", "{called} plugs.group_raises {on} {group}: raised KeyError: 'judge'"),
        (
            GROUP,
            "group_short",
            "{called} plugs.group_short {on} {group}: returned list of 3 for group 0 of 4 samples: expected a "
            "list of one reward per sample",
        ),
        (
            GROUP,
            "group_nan",
            "{called} plugs.group_nan {on} {group}: returned nan (float), expected a finite",
        ),
        (
            GROUP,
            "group_text",
            "{called} plugs.group_text {on} {group}: returned str for group 0 of 4 samples",
        ),
        (
            FILTER,
            "filter_raises",
            "--dynamic-sampling-filter-path plugs.filter_raises called as filter(args, samples) on {group}: "
            "raised KeyError: 'difficulty'",
        ),
        (
            FILTER,
            "filter_text",
            "--dynamic-sampling-filter-path plugs.filter_text called as filter(args, samples) on {group}: "
            "returned str for the group of sample 0: expected a bool or DynamicFilterOutput",
        ),
        (
            BUFFER,
            "buffer_raises",
            "--buffer-filter-path plugs.buffer_raises called as buffer_filter(args, rollout_id 0, buffer, "
            "num_samples 1) with a buffer of 2 copies of {group}: raised IndexError: empty",
        ),
        (BUFFER, "buffer_all", "{group}: buffer_all returned list of 2 groups for 1 asked: expected at most"),
        (BUFFER, "buffer_dict", "{group}: buffer_dict returned dict for 1 asked"),
        (
            BUFFER,
            "buffer_text",
            "{group}: returned groups holding str, expected lists of rollout.sample.Sample",
        ),
        (
            LOSS,
            "loss_raises",
            "--custom-loss-function-path plugs.loss_raises called as a trainer calls it on a synthetic micro-batch "
            "of 2 samples (response lengths [4, 3], logits [2, 4, 8] with grad): raised KeyError: 'values'",
        ),
        (
            LOSS,
            "loss_tensor_only",
            "with grad): plugs.loss_tensor_only returned Tensor; expected (loss, metrics)",
        ),
        (
            LOSS,
            "loss_float",
            "with grad): plugs.loss_float returned float as its loss; expected a 0-dim tensor",
        ),
        (
            LOSS,
            "loss_detached",
            "with grad): backward gave the logits no gradient: the loss must be computed",
        ),
        (LOSS, "loss_nan", "with grad): returned the loss nan, expected a finite number"),
        (LOSS, "loss_vector_metric", "plugs.loss_vector_metric returned metric 'per_token' of shape (2, 4)"),
    ],
)
def test_a_broken_plugin_is_named_with_its_probe_before_anything_starts(
    byo, tmp_path, monkeypatch, capsys, flags, fn, said
):
    assert dry_run(byo, tmp_path, monkeypatch, *flags.format(fn).split()) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert not out and len(err) == 1 and err[0].startswith("rollflow: error: "), err  # the error alone
    group = PROBE_GROUP.format(data=byo["data"])
    assert (
        said.format(group=group, called="--group-rm reward", on="called as reward(args, samples) on")
        in err[0]
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, fn, line",
    [
        (
            GROUP,
            "group_ok",
            "reward check: plugs.group_ok (--group-rm) called once on {group}, each answered by ",
        ),
        (
            FILTER,
            "filter_ok",
            "plug-in check: --dynamic-sampling-filter-path plugs.filter_ok on {group}: keep ",
        ),
        (
            FILTER,
            "filter_bool",
            "plug-in check: --dynamic-sampling-filter-path plugs.filter_bool on {group}: keep ",
        ),
        (
            BUFFER,
            "buffer_ok",
            "plug-in check: --buffer-filter-path plugs.buffer_ok on a buffer of 2 groups, 1 asked",
        ),
        (LOSS, "loss_ok", "loss check: plugs.loss_ok on a synthetic micro-batch of 2 samples: loss "),
    ],
)
def test_a_working_plugin_is_called_and_reported(byo, tmp_path, monkeypatch, capsys, flags, fn, line):
    assert dry_run(byo, tmp_path, monkeypatch, *flags.format(fn).split()) == 0
    out = capsys.readouterr().out
    assert line.format(group=PROBE_GROUP.format(data=byo["data"])) in out
    assert not (tmp_path / "run").exists()


def test_the_reports_say_what_the_plugins_gave(byo, tmp_path, monkeypatch, capsys):
    """Each answered by its label, the group scores 1 each: filter_ok drops it, the buffer filter takes the last."""
    flags = [*FILTER.format("filter_ok").split(), "--custom-rm-path", "plugs.group_ok", "--group-rm"]
    assert dry_run(byo, tmp_path, monkeypatch, *flags) == 0
    out = capsys.readouterr().out
    assert "each answered by its label: 1, 1, 1, 1" in out and "keep False (reason 'same')" in out
    assert dry_run(byo, tmp_path, monkeypatch, *BUFFER.format("buffer_ok").split()) == 0
    assert "1 asked: took 1, left 1 (copies of a group of 4 samples of " in capsys.readouterr().out


def test_generation_plugins_are_said_to_be_left_uncalled(byo, tmp_path, monkeypatch, capsys):
    flags = ["--rm-type", "exact_match", "--custom-generate-function-path"]
    assert dry_run(byo, tmp_path, monkeypatch, *flags, "examples.calculator_tool.calculator.generate") == 0
    out = capsys.readouterr().out.splitlines()
    assert (
        "plug-in check: --custom-generate-function-path examples.calculator_tool.calculator.generate not called: it "
        "generates through the inference engines, which a dry run does not start (its path and signature are "
        "checked)"
    ) in out


def test_a_filter_a_rollout_function_leaves_unused_is_not_called_and_the_notice_says_so(
    byo, tmp_path, monkeypatch, capsys
):
    """Under --rollout-function-path the run never calls the dynamic filter: the dry run does not either (a filter
    that raises passes), and the notice says it is not applied."""
    flags = [*BUFFER.format("buffer_ok").split(), "--dynamic-sampling-filter-path", "plugs.filter_raises"]
    assert dry_run(byo, tmp_path, monkeypatch, *flags) == 0
    captured = capsys.readouterr()
    assert "plugs.filter_raises called" not in captured.out
    assert (
        "rollflow: notice: --dynamic-sampling-filter-path not applied: --rollout-function-path draws the rollout's "
        "groups itself (as in slime, where the default rollout function applies them)"
    ) in captured.err.splitlines()
