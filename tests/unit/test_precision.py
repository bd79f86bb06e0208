"""--precision: the pure resolver of `auto` over fake CPU flag sets (never the test machine's CPU), the flags
(slime's --bf16, a refused --fp16), the per-precision checker bounds, and the resolution before a run starts."""

from __future__ import annotations

import pytest

from config.precision import (
    LOGPROB_ABS_TOL,
    cpu_flags,
    logprob_abs_tol,
    precision_line,
    read_cpu_flags,
    resolve_precision,
)
from flows.cli import build_config, parse_args
from flows.console import header
from flows.resolve import precision_notice, with_precision

EPYC = frozenset("fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni".split())  # AMD Zen 4
XEON = frozenset(
    "fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8".split()
)  # Sapphire Rapids
OLD = frozenset("fpu sse2 avx2 avx512f avx512bw".split())  # AVX-512 without BF16


def cfg(*argv: str):
    return build_config(parse_args(["run", *argv]))


@pytest.mark.parametrize(
    ("flags", "want", "why"),
    [
        (EPYC, "bf16", "CPU has avx512_bf16"),
        (XEON, "bf16", "CPU has amx_bf16"),
        (OLD, "fp32", "no bf16 support on this CPU"),
        (frozenset(), "fp32", "no bf16 support on this CPU"),
    ],
)
def test_auto_resolves_from_the_cpu_flags(flags, want, why):
    assert resolve_precision("auto", flags) == (want, why)
    assert precision_line(want, why) == f"precision: {want} ({why})"


def test_explicit_precisions_stay_and_say_whether_the_cpu_has_bf16():
    assert resolve_precision("fp32", EPYC) == ("fp32", "--precision fp32")
    assert resolve_precision("bf16", XEON)[0] == "bf16" and "amx_bf16" in resolve_precision("bf16", XEON)[1]
    value, why = resolve_precision("bf16", OLD)
    assert value == "bf16" and "emulated" in why
    with pytest.raises(ValueError, match="auto, bf16 or fp32"):
        resolve_precision("fp16", EPYC)


def test_auto_is_fp32_on_the_megatron_trainer_whatever_the_cpu():
    assert resolve_precision("auto", XEON, "megatron") == ("fp32", "the megatron trainer runs float32 only")


def test_cpu_flags_read_the_first_processor_and_a_missing_file_is_no_bf16(tmp_path):
    text = "processor\t: 0\nflags\t\t: fpu avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert cpu_flags(text) == frozenset({"fpu", "avx512_bf16"})
    assert cpu_flags("model name : arm\n") == frozenset()
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    assert read_cpu_flags(info) == frozenset({"fpu", "avx512_bf16"})
    assert read_cpu_flags(tmp_path / "missing") == frozenset()


def test_default_is_fp32_and_megatrons_bf16_flag_is_precision_bf16():
    assert cfg().train.precision == "fp32"
    assert cfg("--bf16").train.precision == "bf16"
    assert cfg("--bf16", "--precision", "auto").train.precision == "bf16"
    assert cfg("--precision", "auto").train.precision == "auto"
    with pytest.raises(ValueError, match="--bf16 is --precision bf16, but --precision fp32"):
        cfg("--bf16", "--precision", "fp32")


def test_fp16_is_refused_naming_why(capsys):
    with pytest.raises(SystemExit):
        parse_args(["run", "--fp16"])
    err = capsys.readouterr().err
    assert "--fp16: not supported" in err and "loss scaling" in err and "--precision" in err


def test_bf16_on_the_megatron_trainer_is_refused_and_auto_is_not(monkeypatch):
    pytest.importorskip("megatron.core")
    with pytest.raises(ValueError, match="megatron trainer runs float32 only"):
        cfg("--precision", "bf16", "--train-backend", "megatron")
    resolved = with_precision(cfg("--precision", "auto", "--train-backend", "megatron"), XEON)
    assert resolved.train.precision == "fp32"


def test_auto_is_resolved_once_into_the_config_and_logged_in_one_line():
    given = cfg("--precision", "auto")
    assert with_precision(given, EPYC).train.precision == "bf16"
    assert with_precision(given, OLD).train.precision == "fp32"
    assert precision_notice(given, EPYC) == "precision: bf16 (CPU has avx512_bf16)"
    assert precision_notice(given, OLD) == "precision: fp32 (no bf16 support on this CPU)"
    assert precision_notice(cfg(), EPYC) is None  # the default run prints what it always printed
    bf16 = with_precision(given, XEON)
    assert "precision bf16" in header(bf16, verbose=False)
    assert "precision" not in header(cfg(), verbose=False)
    from config import dump_yaml

    assert "precision: bf16" in dump_yaml(bf16)


def test_the_log_prob_checker_bound_is_per_precision_unless_given():
    assert logprob_abs_tol("fp32", None) == LOGPROB_ABS_TOL["fp32"] == 0.03
    assert logprob_abs_tol("bf16", None) == LOGPROB_ABS_TOL["bf16"] > LOGPROB_ABS_TOL["fp32"]
    assert logprob_abs_tol("bf16", 0.01) == 0.01
