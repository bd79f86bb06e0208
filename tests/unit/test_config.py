"""Config validation and CLI flag handling: bad input fails before anything starts, naming the flag."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from config import RunConfig, dump_yaml
from flows.cli import build_config, main, make_parser


def parse(*argv: str) -> RunConfig:
    return build_config(make_parser().parse_args(["run", *argv]))


def test_defaults_and_derived_values():
    cfg = RunConfig()
    assert cfg.samples_per_rollout == 128 * 4
    assert cfg.global_batch_size == 128 and cfg.steps_per_rollout == 4
    assert cfg.train.eps_clip_high is None  # resolved to eps_clip by the trainer


def test_slime_flag_names_map_to_sections():
    cfg = parse(
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
        "--lr",
        "1e-4",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.1",
        "--kl-loss-type",
        "k3",
        "--eval-interval",
        "none",
        "--save",
        "/tmp/x",
        "--save-interval",
        "2",
    )
    assert cfg.rollout.num_rollout == 3 and cfg.rollout.n_samples_per_prompt == 2
    assert cfg.train.lr == 1e-4 and cfg.train.use_kl_loss and cfg.train.kl_loss_type == "k3"
    assert cfg.eval.eval_interval is None and cfg.checkpoint.save_interval == 2
    assert cfg.steps_per_rollout == 2


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--rollout-batch-size", "0"], "--rollout-batch-size"),
        (["--rollout-temperature", "-1"], "--rollout-temperature"),
        (["--global-batch-size", "7"], "--global-batch-size 7 must divide"),
        (["--data-parallel-size", "3"], "--data-parallel-size 3"),
        (["--micro-batch-size", "5"], "--micro-batch-size 5"),
        (["--kl-loss-coef", "0.1"], "--use-kl-loss"),
        (["--save-interval", "2"], "--save DIR"),
        (["--ci-save-model-hash"], "--ci-save-model-hash needs --save"),
        (["--ci-check-model-hash"], "--ci-check-model-hash needs --load"),
        (["--debug-exit-after-rollout", "0"], "--debug-exit-after-rollout"),
        (
            ["--tensor-model-parallel-size", "2"],
            "--tensor-model-parallel-size 2 needs --train-backend megatron",
        ),
        (["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size 2: not supported yet"),
        (["--context-parallel-size", "2"], "--context-parallel-size 2: not supported yet"),
        (
            ["--sequence-parallel", "--train-backend", "megatron", "--tensor-model-parallel-size", "2"],
            "--sequence-parallel with --tensor-model-parallel-size 2",
        ),
    ],
)
def test_invalid_values_name_the_flag(argv, needle):
    with pytest.raises(ValueError, match=needle.replace("-", r"\-")):
        parse(*argv)


def test_seeds_are_bounded_to_what_the_seeders_take():
    top = str(2**32 - 1)
    cfg = parse("--seed", top, "--rollout-seed", top)
    assert cfg.train.seed == cfg.rollout.rollout_seed == 2**32 - 1
    for flag, value in (("--seed", str(2**32)), ("--seed", "-1"), ("--rollout-seed", str(2**64))):
        with pytest.raises(ValueError, match=flag.replace("-", r"\-")):
            parse(flag, value)


def _fault(target: dict) -> str:
    hook = "engine_generate_start" if "engine" in target else "trainer_step_before_allreduce"
    return json.dumps(
        [{"request_id": "f", "hook_name": hook, "target": target, "action": {"kind": "observe"}}]
    )


def test_fault_targets_must_be_processes_of_the_run():
    assert parse("--rollout-num-engines", "2", "--ci-fault-hooks", _fault({"engine": 1})).faults.requests()
    assert parse(
        "--data-parallel-size", "2", "--ci-fault-hooks", _fault({"trainer_rank": 1})
    ).faults.requests()
    with pytest.raises(ValueError, match="targets engine 2, but the run has 2 engine"):
        parse("--rollout-num-engines", "2", "--ci-fault-hooks", _fault({"engine": 2}))
    with pytest.raises(ValueError, match=r"targets trainer rank 1, but the run has 1 trainer rank\(s\)"):
        parse("--ci-fault-hooks", _fault({"trainer_rank": 1}))
    with pytest.raises(ValueError, match="has 0 engine.* \\(none in train-only mode\\)"):
        parse("--debug-train-only", "--ci-fault-hooks", _fault({"engine": 0}))


@pytest.mark.parametrize("value", ["0", "-0.5", "nan", "inf"])
def test_rm_timeout_must_be_a_positive_number(value):
    with pytest.raises(ValueError, match=r"\-\-rm\-timeout"):
        parse("--rm-timeout", value)


def test_rm_timeout_default_and_none():
    # unset: 5 s for a custom reward; none for a built-in, so remote_rm keeps slime's per-attempt bound and retries
    assert parse("--custom-rm-path", "m.fn").reward.rm_timeout == 5.0
    assert parse("--rm-type", "remote_rm").reward.rm_timeout is None and RunConfig().reward.rm_timeout is None
    assert "rm_timeout" not in parse("--rm-type", "remote_rm").reward.model_fields_set  # still not given
    assert parse("--rm-type", "remote_rm", "--rm-timeout", "30").reward.rm_timeout == 30.0
    assert parse("--rm-timeout", "0.5").reward.rm_timeout == 0.5
    assert parse("--rm-timeout", "none").reward.rm_timeout is None


def test_unknown_flag_and_bad_choice_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        make_parser().parse_args(["run", "--no-such-flag", "1"])
    assert e.value.code == 2 and "--no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--kl-loss-type", "k9"])


def test_main_rejects_before_starting_anything(capsys, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "flows.run", raising=False)
    assert main(["run", "--rollout-batch-size", "-3"]) == 2
    assert "--rollout-batch-size" in capsys.readouterr().err
    assert "flows.run" not in sys.modules  # neither Ray nor Prefect was imported


def test_yaml_round_trip_and_flags_override(tmp_path):
    cfg = parse("--num-rollout", "5", "--lr", "0.01")
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    again = parse("--config", str(path), "--lr", "0.02")
    assert again.rollout.num_rollout == 5 and again.train.lr == 0.02
    path.write_text("train: {no_such_key: 1}\n")
    with pytest.raises(ValueError, match="no-such-key"):
        parse("--config", str(path))


def test_config_is_frozen_and_hash_is_stable():
    a, b = RunConfig(), RunConfig()
    assert a.config_hash() == b.config_hash()
    with pytest.raises(ValidationError):
        a.rollout.num_rollout = 2  # type: ignore[misc]


def test_prefect_env_batches_event_writes_and_keeps_user_values(monkeypatch):
    """The names are ones this Prefect reads (a renamed setting would silently do nothing), and a
    value the user already set wins."""
    from prefect.settings.models.root import Settings

    from flows.cli import EPHEMERAL_SERVER_DEFAULTS, PREFECT_ENV_DEFAULTS, configure_prefect_env

    for name in [*PREFECT_ENV_DEFAULTS, *EPHEMERAL_SERVER_DEFAULTS, "PREFECT_API_URL"]:
        monkeypatch.delenv(name, raising=False)
    configure_prefect_env()
    settings = Settings()
    persister = settings.server.services.event_persister
    assert (persister.batch_size, persister.flush_interval) == (1000, 60)
    recorder = settings.server.services.task_run_recorder
    assert (recorder.batch_size, recorder.flush_interval) == (1000, 1)
    assert (
        settings.server.analytics_enabled is False
        and settings.server.ephemeral.startup_timeout_seconds == 120
    )
    # the run's own temporary server: no automations services
    services = settings.server.services
    assert services.triggers.enabled is False  # triggers and the actions they fire

    monkeypatch.setenv("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE", "50")
    monkeypatch.setenv("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL", "5")
    configure_prefect_env()
    persister = Settings().server.services.event_persister
    assert (persister.batch_size, persister.flush_interval) == (50, 5)


def test_served_and_named_servers_keep_their_automations(monkeypatch):
    """`rollflow server`, and a run against a server named by PREFECT_API_URL, leave the automations services as
    Prefect has them (only the temporary server of a run turns them off)."""
    from prefect.settings.models.root import Settings

    from flows.cli import EPHEMERAL_SERVER_DEFAULTS, configure_prefect_env

    for name in [*EPHEMERAL_SERVER_DEFAULTS, "PREFECT_API_URL"]:
        monkeypatch.delenv(name, raising=False)
    configure_prefect_env(serving=True)
    assert Settings().server.services.triggers.enabled is True
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    configure_prefect_env()
    assert Settings().server.services.triggers.enabled is True


def test_server_command_runs_without_the_venv_on_path(monkeypatch, tmp_path):
    """`rollflow server` execs Prefect through this interpreter, so it works from `scripts/rollflow`
    (which does not put the venv's bin/ on PATH)."""
    import subprocess
    import sys

    import flows.cli

    execs = []

    def fake_execv(path, argv):  # exec never returns
        execs.append((path, argv))
        raise SystemExit(0)

    monkeypatch.setattr(flows.cli.os, "execv", fake_execv)
    with pytest.raises(SystemExit):
        main(["server", "--port", "4321", "--files-port", "0"])  # no file server beside an exec that is faked
    [(path, argv)] = execs
    assert path == sys.executable and argv[:6] == [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--port",
    ]
    assert argv[6] == "4321"
    done = subprocess.run(
        [*argv, "--help"],
        env={"PATH": "/nonexistent", "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--port" in done.stdout, done.stderr[-2000:]


# -- slime's data, reward and eval flags (issue 04) ------------------------------------------------------------
def test_data_reward_and_list_flags_parse():
    cfg = parse(
        "--prompt-data",
        "/d/train.jsonl",
        "--input-key",
        "messages",
        "--label-key",
        "answer",
        "--apply-chat-template",
        "--apply-chat-template-kwargs",
        '{"enable_thinking": false}',
        "--eval-prompt-data",
        "aime",
        "/d/aime.jsonl",
        "gsm8k",
        "/d/gsm8k.parquet",
        "--rollout-stop",
        "</answer>",
        "--rollout-stop-token-ids",
        "7",
        "8",
        "--rm-type",
        "math",
        "--eval-top-p",
        "0.9",
        "--eval-max-response-len",
        "16",
        "--rollout-shuffle",
    )
    assert cfg.data.eval_datasets == [("aime", "/d/aime.jsonl"), ("gsm8k", "/d/gsm8k.parquet")]
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False} and cfg.data.rollout_shuffle
    assert cfg.rollout.rollout_stop == ["</answer>"] and cfg.rollout.rollout_stop_token_ids == [7, 8]
    assert (
        cfg.reward.rm_type == "math" and cfg.eval.eval_top_p == 0.9 and cfg.eval.eval_max_response_len == 16
    )


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--eval-prompt-data", "a", "/x", "a", "/y"], "duplicate eval dataset name"),
        (["--eval-prompt-data", "a", "/x", "b"], "expected NAME PATH pairs"),
        (["--eval-prompt-data", "a/b", "/x"], "contain no '/'"),
    ],
)
def test_bad_eval_data_flags(argv, needle):
    with pytest.raises(ValueError, match=needle):
        parse(*argv)


def test_backends_that_are_not_registered_are_refused_at_parse_time(capsys):
    for argv in (["--train-backend", "no-such-backend"], ["--rollout-backend", "sglang"]):
        with pytest.raises(SystemExit) as e:
            make_parser().parse_args(["run", *argv])
        assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_bad_json_flag_is_named(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--apply-chat-template-kwargs", "{bad"])
    assert "--apply-chat-template-kwargs" in capsys.readouterr().err
