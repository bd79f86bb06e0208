"""slime's launch lines under `rollflow run`: every flag of two of slime's scripts parses, defaults are slime's,
architecture flags are checked against config.json, SGLang flags are kept and named once, GPU counts derive the
trainer and engine counts as slime does, a run on user data is named after it, and an unknown flag says what to
do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config import SECTIONS, RunConfig
from config.arch import ArchConfig, check_arch
from config.presets import RECIPE_PRESETS
from config.slime_compat import FLAGS, notices
from flows.cli import build_config, parse_args
from flows.slime_script import arrays_of, train_args

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "slime_scripts" / "scripts"
SCRIPT_NAMES = ("run-qwen2.5-0.5B-reproducibility.sh", "run-qwen3-4B.sh")


def parse(*argv: str) -> RunConfig:
    return build_config(parse_args(["run", *argv]))


def field_of(flag: str) -> tuple[str, str]:
    """(section, field) of a run flag ("" = top level)."""
    name = flag.removeprefix("--").replace("-", "_")
    if name in RunConfig.model_fields and name not in SECTIONS:
        return "", name
    for section, model in SECTIONS.items():
        if name in model.model_fields:
            return section, name
    raise KeyError(flag)


def default_of(flag: str) -> Any:
    section, name = field_of(flag)
    model = SECTIONS[section] if section else RunConfig
    info = model.model_fields[name]
    return info.default_factory() if info.default_factory else info.default  # type: ignore[call-arg]


# (flag, slime's default in slime/utils/arguments.py or Megatron's where slime keeps it)
SLIME_DEFAULTS: list[tuple[str, Any]] = [
    ("--n-samples-per-prompt", 1),
    ("--n-samples-per-eval-prompt", 1),
    ("--lr", 1e-6),
    ("--lr-decay-style", "linear"),
    ("--kl-loss-type", "k1"),
    ("--eval-interval", None),
    ("--weight-decay", 0.01),
    ("--micro-batch-size", 1),
    ("--global-batch-size", None),  # Megatron's: --micro-batch-size x DP
    ("--eps-clip", 0.2),
    ("--eps-clip-high", None),
    ("--eps-clip-c", None),
    ("--kl-loss-coef", 0.0),
    ("--entropy-coef", 0.0),
    ("--use-kl-loss", False),
    ("--advantage-estimator", "grpo"),
    ("--rollout-temperature", 1.0),
    ("--rollout-top-p", 1.0),
    ("--rollout-top-k", -1),
    ("--rollout-seed", 42),
    ("--seed", 1234),
    ("--clip-grad", 1.0),
    ("--adam-beta1", 0.9),
    ("--adam-beta2", 0.999),
    ("--min-lr", 0.0),
    ("--lr-warmup-iters", 0),
    ("--input-key", "input"),
    ("--label-key", None),
    ("--metadata-key", "metadata"),
    ("--tool-key", "tools"),
    ("--rollout-shuffle", False),
    ("--apply-chat-template", False),
    ("--rollout-max-prompt-len", None),
    ("--eval-temperature", None),
    ("--eval-top-p", None),
    ("--eval-top-k", None),
    ("--eval-max-response-len", None),
    ("--save-interval", None),
    ("--actor-num-nodes", 1),
    ("--rollout-num-gpus", None),
    ("--rollout-num-gpus-per-engine", 1),
    ("--colocate", False),
    ("--tensor-model-parallel-size", 1),
    ("--pipeline-model-parallel-size", 1),
    ("--context-parallel-size", 1),
    ("--sequence-parallel", False),
    ("--use-wandb", False),
    ("--wandb-project", None),
    ("--wandb-group", None),
    ("--wandb-host", None),
]

# (flag, slime's, ours): slime has no fixed default (required, or left to the engine or Megatron)
NO_SLIME_DEFAULT: list[tuple[str, str, Any]] = [
    ("--num-rollout", "required, or --num-epoch", 100),
    ("--rollout-batch-size", "required", 128),
    ("--rollout-max-response-len", "None: up to SGLang's context length", 6),
    ("--actor-num-gpus-per-node", "8 GPUs", None),  # here: the world size TP x DP over the nodes
]


@pytest.mark.parametrize("flag, slime", SLIME_DEFAULTS)
def test_defaults_are_slimes(flag, slime):
    assert default_of(flag) == slime


@pytest.mark.parametrize("flag, slime, ours", NO_SLIME_DEFAULT)
def test_flags_slime_leaves_without_a_default(flag, slime, ours):
    assert default_of(flag) == ours, f"{flag}: slime {slime}"


def test_the_recipe_keeps_its_tuned_values_and_user_data_gets_slimes():
    plain = RunConfig()
    assert (plain.rollout.n_samples_per_prompt, plain.eval.n_samples_per_eval_prompt) == (4, 4)
    assert (plain.train.lr, plain.train.lr_decay_style, plain.train.kl_loss_type) == (
        2e-4,
        "cosine",
        "low_var_kl",
    )
    assert (plain.train.weight_decay, plain.train.micro_batch_size, plain.eval.eval_interval) == (
        0.0,
        None,
        10,
    )
    for section, values in RECIPE_PRESETS["tiny-arith"].items():
        assert {k: getattr(getattr(plain, section), k) for k in values} == values
        # filled in, not given: a deployment's served defaults still apply over them
        assert not set(values) & getattr(plain, section).model_fields_set
    mine = parse(
        "--prompt-data",
        "x.jsonl",
        "--rm-type",
        "math",
        "--rollout-batch-size",
        "4",
        "--global-batch-size",
        "4",
    )
    assert (mine.rollout.n_samples_per_prompt, mine.train.lr, mine.train.kl_loss_type) == (1, 1e-6, "k1")
    # a flag wins over the preset
    assert parse("--lr", "1e-3").train.lr == 1e-3


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_every_flag_of_slimes_scripts_parses(script):
    argv = train_args(SCRIPTS / script)
    flags = {a for a in argv if a.startswith("--")}
    assert len(flags) > 50
    args = parse_args(["run", *argv])  # an unknown flag would exit
    for flag in flags:
        assert flag in FLAGS or flag.startswith("--sglang-") or field_of(flag), flag
    # with the sizes a CPU holds (TP 1): the whole line builds a config
    sized = [
        ("1" if prev == "--tensor-model-parallel-size" else a)
        for prev, a in zip(["", *argv[:-1]], argv, strict=True)
    ]
    cfg = build_config(parse_args(["run", *sized]))
    assert cfg.sglang.sglang_mem_fraction_static == 0.7 and cfg.arch.attention_backend == "flash"
    assert cfg.train.data_parallel_size == 8  # --actor-num-nodes 1 x --actor-num-gpus-per-node 8, TP 1
    per_engine = cfg.rollout.rollout_num_gpus_per_engine
    assert (
        cfg.rollout.rollout_num_gpus == 8 and cfg.rollout.rollout_num_engines == 8 // per_engine
    )  # --colocate
    assert vars(args)  # parsed


def test_a_script_is_read_as_bash_would_pass_it():
    small = train_args(SCRIPTS / "run-qwen2.5-0.5B-reproducibility.sh")
    # its `source "${SCRIPT_DIR}/scripts/models/..."` names a path under scripts/scripts: found one dir up
    assert small[small.index("--num-layers") + 1] == "24" and small[:4] == [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "8",
    ]
    assert small[small.index("--eval-prompt-data") + 1 :][:2] == ["gsm8k", "/root/gsm8k/test.parquet"]
    assert "#--hf-checkpoint" not in " ".join(train_args(SCRIPTS / "run-qwen3-4B.sh"))  # comments dropped
    big = train_args(SCRIPTS / "run-qwen3-4B.sh", {"NUM_GPUS": "4", "MODEL_ARGS_ROTARY_BASE": "5000000"})
    assert big[big.index("--actor-num-gpus-per-node") + 1] == "4"  # a variable given wins
    assert big[big.index("--rotary-base") + 1] == "5000000"  # ${VAR:-default}: the variable, else the default
    assert (
        train_args(SCRIPTS / "run-qwen3-4B.sh")[
            train_args(SCRIPTS / "run-qwen3-4B.sh").index("--rotary-base") + 1
        ]
        == "1000000"
    )


def test_sequence_parallel_above_tp_1_is_refused_with_what_to_do():
    argv = train_args(SCRIPTS / "run-qwen3-4B.sh") + ["--train-backend", "megatron"]
    pytest.importorskip("megatron.core")
    with pytest.raises(ValueError, match="--sequence-parallel with --tensor-model-parallel-size 2: .*drop"):
        build_config(parse_args(["run", *argv]))


QWEN2 = {
    "model_type": "qwen2",
    "num_hidden_layers": 24,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
QWEN3 = {
    **QWEN2,
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": False,
}


def arch_of(model_script: str) -> ArchConfig:
    return parse(*arrays_of(SCRIPTS / "models" / model_script)["MODEL_ARGS"]).arch


def test_model_args_match_their_models_config():
    check_arch(arch_of("qwen2.5-0.5B.sh"), QWEN2, "qwen2/config.json")
    check_arch(arch_of("qwen3-4B.sh"), QWEN3, "qwen3/config.json")


@pytest.mark.parametrize(
    "argv, hf, needle",
    [
        (
            ["--num-layers", "24"],
            {**QWEN2, "num_hidden_layers": 3},
            "--num-layers 24 disagrees with the model: num_hidden_layers is 3 in m/config.json",
        ),
        (["--rotary-base", "10000"], QWEN2, "--rotary-base 10000.0 .*rope_theta is 1000000.0"),
        (["--qk-layernorm"], QWEN2, "--qk-layernorm .*q/k norm of model_type 'qwen2' is False"),
        (["--add-qkv-bias"], QWEN3, "--add-qkv-bias .*q/k/v bias of model_type 'qwen3' is False"),
        (["--kv-channels", "64"], QWEN3, "--kv-channels 64 .*head_dim is 128"),
        (
            ["--group-query-attention", "--num-query-groups", "4"],
            QWEN3,
            "--num-query-groups 4 .*num_key_value_heads is 8",
        ),
        (["--group-query-attention"], QWEN3, "--group-query-attention .*1 key/value head"),
        (["--vocab-size", "151643"], QWEN2, "--vocab-size 151643 .*vocab_size is 151936"),
        (["--untie-embeddings-and-output-weights"], QWEN2, "not tie_word_embeddings is False"),
        (["--normalization", "LayerNorm"], QWEN2, "--normalization LayerNorm .*'RMSNorm'"),
        (
            ["--max-position-embeddings", "4096"],
            {**QWEN2, "max_position_embeddings": 32768},
            "--max-position-embeddings 4096 .*max_position_embeddings is 32768",
        ),
    ],
)
def test_a_mismatch_names_the_flag_both_values_and_the_file(argv, hf, needle):
    with pytest.raises(ValueError, match=needle):
        check_arch(parse(*argv).arch, hf, "m/config.json")


def test_unset_flags_are_not_checked_and_unknown_model_types_pass():
    check_arch(ArchConfig(), {"model_type": "gpt2", "n_layer": 2}, "x")
    check_arch(parse("--qk-layernorm", "--swiglu").arch, {"model_type": "something-new"}, "x")


def test_arch_check_runs_on_the_resolved_checkpoint(tmp_path):
    from flows.resolve import check_model_args

    (tmp_path / "config.json").write_text(json.dumps(QWEN2))
    cfg = parse("--hf-checkpoint", str(tmp_path), "--num-layers", "24", "--hidden-size", "896")
    check_model_args(cfg)
    with pytest.raises(
        ValueError, match=rf"--hidden-size 1024 .*hidden_size is 896 in {tmp_path}/config.json"
    ):
        check_model_args(parse("--hf-checkpoint", str(tmp_path), "--hidden-size", "1024"))


def test_a_model_the_megatron_backend_cannot_build_is_named_before_the_run(tmp_path):
    pytest.importorskip("megatron.core")
    from flows.resolve import check_model_args

    for config in (QWEN2, QWEN3):
        (tmp_path / "config.json").write_text(json.dumps(config))
        check_model_args(parse("--hf-checkpoint", str(tmp_path), "--train-backend", "megatron"))
    (tmp_path / "config.json").write_text(
        json.dumps({**QWEN3, "model_type": "qwen3_moe", "num_experts": 128})
    )
    check_model_args(parse("--hf-checkpoint", str(tmp_path)))  # the torch backend runs any causal LM
    with pytest.raises(
        ValueError, match=r"--train-backend megatron: .*config.json: .*model_type 'qwen3_moe' is not"
    ):
        check_model_args(parse("--hf-checkpoint", str(tmp_path), "--train-backend", "megatron"))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--attention-dropout", "0.1"], "--attention-dropout: 0.1: rollflow's trainers run without dropout"),
        (["--hidden-dropout", "0.1"], "--hidden-dropout: 0.1: .*set 0.0 or leave it out"),
        (
            ["--expert-model-parallel-size", "2"],
            "--expert-model-parallel-size: 2: .*dense models.*leave it at 1",
        ),
        (["--expert-tensor-parallel-size", "4"], "--expert-tensor-parallel-size: 4: .*dense"),
    ],
)
def test_settings_the_trainers_cannot_have_are_refused_with_what_to_do(argv, needle):
    with pytest.raises(ValueError, match=needle):
        parse(*argv)


def test_megatron_numerics_switches_are_accepted():
    cfg = parse(
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--sequence-parallel",
        "--no-rope-fusion",
        "--no-masked-softmax-fusion",
        "--no-gradient-accumulation-fusion",
    )
    assert cfg.arch.attention_softmax_in_fp32 and cfg.train.sequence_parallel
    assert notices(cfg) == []  # all of them mean here what they mean in slime


def test_sglang_flags_are_kept_and_named_once_in_one_notice():
    cfg = parse(
        "--sglang-mem-fraction-static",
        "0.7",
        "--sglang-enable-deterministic-inference",
        "--sglang-attention-backend",
        "flashinfer",
        "--sglang-cuda-graph-bs",
        "1",
        "2",
        "--sglang-enable-metrics",
        "--sglang-log-requests-level=2",
    )
    s = cfg.sglang
    assert (s.sglang_mem_fraction_static, s.sglang_enable_deterministic_inference) == (0.7, True)
    # slime forwards every SGLang server argument: the untyped ones are kept as text
    assert s.sglang_server_args == {"cuda_graph_bs": "1 2", "enable_metrics": True, "log_requests_level": "2"}
    lines = notices(cfg)
    assert len(lines) == 1 and lines[0].startswith("the torch engine ignores --sglang-mem-fraction-static, ")
    assert "--sglang-enable-metrics" in lines[0] and "--sglang-log-requests-level" in lines[0]
    assert notices(RunConfig()) == []


def test_a_run_on_user_data_is_told_the_values_slime_has_no_default_for():
    base = ("--prompt-data", "x.jsonl", "--rm-type", "math")
    (line,) = notices(parse(*base, "--global-batch-size", "4"))
    assert line == (
        "not given, so rollflow's defaults: --num-rollout 100 (slime requires it or --num-epoch), "
        "--rollout-batch-size 128 (slime requires it), --rollout-max-response-len 6 (slime leaves it to SGLang: up "
        "to the context); set them for your data"
    )
    given = ("--num-rollout", "3", "--rollout-batch-size", "4", "--global-batch-size", "4")
    (line,) = notices(parse(*base, *given))
    assert line.startswith("not given, so rollflow's defaults: --rollout-max-response-len 6 (slime leaves")
    assert notices(parse(*base, *given, "--rollout-max-response-len", "512")) == []
    assert notices(parse()) == []  # the recipe's own data: its values are its own


def test_the_notice_reaches_the_console_of_a_run_that_goes_ahead(capsys, tmp_path):
    from flows import cli

    argv = ["run", "--dry-run", "--run-dir", str(tmp_path / "r"), "--sglang-mem-fraction-static", "0.5"]
    assert cli.main([*argv, "--attention-backend", "flash"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sum("--sglang-mem-fraction-static" in ln for ln in err) == 1
    assert any(ln.startswith("rollflow: notice: --attention-backend flash") for ln in err)
    # a refused run prints its one-line error only
    assert cli.main([*argv, "--lr", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--rollout-batchsize", "8"],
            "unrecognized flag --rollout-batchsize: did you mean --rollout-batch-size?",
        ),
        (
            ["--frobnicate"],
            r"^rollflow: error: unrecognized flag --frobnicate \(rollflow run --help lists every flag\)$",
        ),
        (["--num-experts", "8"], "--num-experts: not supported: .*dense .*use a dense checkpoint"),
        (["--moe-router-topk", "2"], "--moe-router-topk: not supported: .*--moe-\\*"),
        (["--spec", "x"], "--spec: not supported: rollflow builds its own Megatron layer spec"),
        (["--num-epoch", "3"], "--num-epoch: not supported: give --num-rollout N instead"),
        (["--use-tis"], "--use-tis: not supported: truncated importance sampling is not implemented"),
        (
            ["--optimizer-cpu-offload"],
            "--optimizer-cpu-offload: not supported: .*leave it out: the results are the same",
        ),
        (["--eval"], "unrecognized flag --eval[ :]"),  # no abbreviations: slime's flags are whole
    ],
)
def test_an_unknown_flag_says_what_to_do(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["run", *argv])
    assert e.value.code == 2
    import re

    err = capsys.readouterr().err.strip()
    assert re.search(needle, err) and len(err.splitlines()) == 1, err


def test_wandb_flags_are_taken_and_the_key_never_reaches_the_config():
    args = parse_args(
        [
            "run",
            "--wandb-host",
            "https://wandb.example",
            "--wandb-team",
            "t",
            "--wandb-project",
            "p",
            "--wandb-key",
            "secret",
        ]
    )
    cfg = build_config(args)
    assert (cfg.logging.wandb_host, cfg.logging.wandb_team, cfg.logging.wandb_project) == (
        "https://wandb.example",
        "t",
        "p",
    )
    assert args.wandb_key == "secret" and "secret" not in cfg.model_dump_json()


@pytest.mark.parametrize("mode, logs_in", [("online", True), ("offline", False)])
def test_wandb_key_logs_in_at_wandb_host_only_online(mode, logs_in, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from tasks.trackers import WandbTracker

    calls: list[dict] = []
    monkeypatch.setattr(wandb, "login", lambda **kw: calls.append(kw))
    monkeypatch.setattr(
        wandb, "init", lambda **kw: type("Run", (), {"define_metric": lambda *a, **k: None})()
    )
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    WandbTracker(parse("--use-wandb", "--wandb-host", "https://wandb.example", "--wandb-mode", mode))
    assert calls == ([{"key": "secret", "host": "https://wandb.example"}] if logs_in else [])


def test_gpu_counts_derive_dp_and_engines_as_slime_does():
    cfg = parse("--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2", "--global-batch-size", "8")
    assert (cfg.train.data_parallel_size, cfg.trainer_world_size) == (4, 4)
    # --colocate: the engines get the trainers' slots, --rollout-num-gpus-per-engine of them each
    cfg = parse("--actor-num-gpus-per-node", "4", "--colocate", "--rollout-num-gpus-per-engine", "2")
    assert (cfg.rollout.rollout_num_gpus, cfg.rollout.rollout_num_engines) == (4, 2)
    assert parse("--colocate", "--rollout-num-gpus", "2").rollout.rollout_num_engines == 2  # given: kept
    with pytest.raises(
        ValueError,
        match="--actor-num-nodes 1 x --actor-num-gpus-per-node 4 = 4 slots.*--data-parallel-size 2",
    ):
        parse("--actor-num-gpus-per-node", "4", "--data-parallel-size", "2")
    with pytest.raises(
        ValueError,
        match="--actor-num-gpus-per-node 3 = 3 trainer slots is not a multiple of --tensor-model-parallel-size 2",
    ):
        parse(
            "--actor-num-gpus-per-node",
            "3",
            "--tensor-model-parallel-size",
            "2",
            "--train-backend",
            "megatron",
        )
    with pytest.raises(
        ValueError, match="--colocate gives the engines the 3 trainer slots, not a multiple of"
    ):
        parse(
            "--actor-num-gpus-per-node",
            "3",
            "--colocate",
            "--rollout-num-gpus-per-engine",
            "2",
            "--global-batch-size",
            "3",
        )
    with pytest.raises(ValueError, match="--rollout-num-engines 3 contradicts --rollout-num-gpus 4"):
        parse("--rollout-num-engines", "3", "--rollout-num-gpus", "4")


@pytest.mark.parametrize(
    "argv, name",
    [
        (["--prompt-data", "/data/dapo-math-17k/dapo-math-17k.jsonl"], "dapo-math-17k"),
        (["--prompt-data", "/root/gsm8k/train.parquet"], "gsm8k-train"),
        (["--prompt-data", "/root/gsm8k/train.parquet", "--wandb-group", "qwen2.5 gsm8k"], "qwen2.5-gsm8k"),
        (["--prompt-data", "/root/gsm8k/train.parquet", "--name", "mine"], "mine"),
        ([], "tiny-arith"),
        (["--recipe", "long-arith"], "long-arith"),  # a recipe's own data: named after the recipe
        (["--recipe", "long-arith", "--name", "mine"], "mine"),
    ],
)
def test_a_run_on_user_data_is_named_after_it(argv, name):
    given = argv and argv[0] == "--prompt-data"
    extra = ["--rm-type", "math", "--rollout-batch-size", "4", "--global-batch-size", "4"] if given else []
    assert parse(*argv, *extra).name == name


def test_a_collision_suggests_another_name(tmp_path, monkeypatch):
    from artifacts import rundir
    from flows import runtime

    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    rundir.write_info(run_dir, rundir.new_info("x"))
    (run_dir / "metrics.jsonl").write_text(
        '{"kind": "rollout", "run_id": "r", "rollout_id": 0, "metrics": {}}\n'
    )
    cfg = RunConfig(name="x", run_dir=str(run_dir))
    with (
        open(tmp_path / "lock", "w") as lock,
        pytest.raises(ValueError, match="--resume .*--name NEW_NAME.*--overwrite"),
    ):
        runtime._start_point(cfg, lock, resume=False, overwrite=False)
