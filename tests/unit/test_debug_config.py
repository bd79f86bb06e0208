"""Validation of the debug flags (the anchors' rules), all before anything starts."""

from __future__ import annotations

import pytest

from flows.cli import build_config, main, make_parser


def parse(*argv: str):
    return build_config(make_parser().parse_args(["run", *argv]))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--debug-rollout-only", "--debug-train-only"], "mutually exclusive"),
        (
            ["--debug-rollout-only", "--load-debug-rollout-data", "/r_{rollout_id}.pt"],
            "implies --debug-train-only",
        ),
        (["--save-debug-rollout-data", "/tmp/rollout.parquet"], "no {rollout_id}"),
        (["--save-debug-rollout-data", "/tmp/r_{rollout_id}.json"], "extension"),
        (["--save-debug-rollout-data", "/tmp/r_{rollout_id}_{rank}.pt"], "bad template"),
        (["--save-debug-train-data", "/tmp/t.parquet"], "no {rollout_id}"),
        (
            ["--save-debug-rollout-data", "/tmp/r_{rollout_id:06d}.pt"],
            "bad template",
        ),  # ids are strings (eval_3)
        (["--save-debug-rollout-data", "/tmp/r_{rollout_id.pt"], "bad template"),
        (["--load-debug-rollout-data-subsample", "0.5"], "needs --load-debug-rollout-data"),
        (
            ["--load-debug-rollout-data", "/r_{rollout_id}.pt", "--load-debug-rollout-data-subsample", "0"],
            "--load-debug-rollout-data-subsample",
        ),
        (["--ci-inject-rollout-data-path", "/r_{rollout_id}.pt", "--debug-train-only"], "needs engines"),
        (["--ci-inject-rollout-data-path", "/r_{rollout_id}.pt", "--debug-rollout-only"], "feeds training"),
        (["--ci-inject-rollout-data-path", "/r.pt"], "no {rollout_id}"),
        (["--load-forge-rollout-data", "/r.pt", "--debug-rollout-only"], "--load-forge-rollout-data"),
        (
            ["--load-forge-rollout-data", "/r.pt", "--ci-inject-rollout-data-path", "/r_{rollout_id}.pt"],
            "mutually exclusive",
        ),
        (["--ci-inject-rollout-data-min-match-ratio", "1.5"], "--ci-inject-rollout-data-min-match-ratio"),
        (
            [
                "--save-debug-rollout-data",
                "/x_{rollout_id}.pt",
                "--save-debug-train-data",
                "/x_{rollout_id}.pt",
            ],
            "differ",
        ),
    ],
)
def test_invalid_debug_combinations_are_rejected(argv, needle):
    with pytest.raises(ValueError) as e:
        parse(*argv)
    assert needle in str(e.value)


def test_load_implies_train_only_and_dump_details_wins():
    cfg = parse(
        "--load-debug-rollout-data",
        "/tmp/r.parquet",
        "--dump-details",
        "/tmp/d",
        "--save-debug-rollout-data",
        "/tmp/s_{rollout_id}.pt",
    )
    assert cfg.train_only and not cfg.rollout_only
    assert cfg.rollout_template == "/tmp/d/rollout_data/{rollout_id}.parquet"
    assert cfg.train_data_template == "/tmp/d/train_data/{rollout_id}_{rank}.parquet"
    assert parse(
        "--load-forge-rollout-data", "/tmp/r.parquet"
    ).debug.load_forge_rollout_data  # literal is fine


def test_inspect_and_convert_commands(tmp_path, capsys):
    from artifacts.schema import Sample
    from artifacts.store import write_rollout

    samples = [
        Sample(
            rollout_id=3,
            group_index=i // 2,
            sample_index=i,
            prompt="p",
            prompt_tokens=[1, 2],
            response="7",
            response_tokens=[5, 1],
            response_length=2,
            label="7",
            reward=float(i % 2),
            status="completed",
            loss_mask=[1, 1],
            rollout_log_probs=[-0.5, -0.25],
            weight_version=3,
            seed=i,
            metadata={},
        )
        for i in range(4)
    ]
    write_rollout(tmp_path / "r.parquet", samples)
    assert main(["convert", str(tmp_path / "r.parquet"), str(tmp_path / "r.pt")]) == 0
    assert main(["inspect", str(tmp_path / "r.pt"), "--fields", "sample_index,reward", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "rollout 3: {'samples': 4" in out
        and "'rollout/raw_reward': 0.5000" in out
        and "sample_index=1" in out
    )
    assert main(["inspect", str(tmp_path / "r.txt")]) == 2
    assert main(["inspect", str(tmp_path / "r.pt"), "--fields", "nope"]) == 2
