"""Numeric precision of a run (`--precision`): what `auto` resolves to on this CPU, and the bounds that depend on it.

bf16 = the engines hold bfloat16 weights and KV cache (logits upcast to float32 before the log-softmax and
sampling); the torch trainer keeps float32 master weights and optimizer state and runs its forward under CPU
autocast to bfloat16, its log-probs, entropy and loss in float32. fp32 = float32 everywhere. `auto` is resolved
once, before anything starts, by `resolve_precision` over the CPU's flags: bf16 where the CPU has bfloat16
arithmetic (AVX-512 BF16 or AMX-BF16), float32 where it would only be emulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

Precision = Literal["auto", "bf16", "fp32"]
Resolved = Literal["bf16", "fp32"]

# /proc/cpuinfo flags of CPUs with bfloat16 arithmetic (AMD Zen 4+ and Intel Cooper Lake: avx512_bf16; Intel
# Sapphire Rapids+: amx_bf16 as well); in the order the log line names the first one found
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")

# torch dtype names per resolved precision (the name, so config imports no torch)
DTYPE_NAMES: dict[str, str] = {"bf16": "bfloat16", "fp32": "float32"}

# The --ci-test log-prob checker's contract, per precision: |rollout/log_probs - rollout/rollout_log_probs| (the
# means over a rollout's response tokens of the trainer's and the engine's log-probs of the same tokens) stays below
# this. fp32: miles' bound. bf16: both sides round every matmul input to 8 significant bits (a relative 2^-9), in
# different kernels and orders (the engine's residual stream is bfloat16, the trainer's autocast keeps it float32),
# so one token's log-prob may move by a few hundredths and a rollout's mean by less; the bound leaves room for a deep
# model's accumulated rounding and stays below the gaps a real fault gives (another template, stale weights).
LOGPROB_ABS_TOL: dict[str, float] = {"fp32": 0.03, "bf16": 0.05}

# slime's --ci-train-rollout-logprob-abs-diff-threshold: the first step's mean per-token |trainer - engine|
# (train/train_rollout_logprob_abs_diff), the doctor's logprob-gap rule. slime sets it for bfloat16 engines, so
# it holds at both precisions.
TOKEN_ABS_DIFF_TOL = 0.1


def read_cpu_flags(path: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The `flags` of the first processor in `path` (empty when the file is missing or unreadable: a CPU whose
    flags cannot be read is taken as one without bf16)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return frozenset()
    return cpu_flags(text)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first `flags` line of a /proc/cpuinfo text (x86); empty when it has none."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def resolve_precision(
    requested: str, flags: frozenset[str], train_backend: str = "torch"
) -> tuple[Resolved, str]:
    """(bf16 | fp32, why) for `--precision requested` on a CPU with `flags` and the `train_backend` trainer.
    `auto` gives bf16 where the CPU has bfloat16 arithmetic and the trainer runs it, else fp32; an explicit value
    stays, with a reason that says whether this CPU computes it natively. Pure: the same answer on any machine
    for the same arguments."""
    native = next((f for f in BF16_CPU_FLAGS if f in flags), None)
    if requested == "fp32":
        return "fp32", "--precision fp32"
    if requested == "bf16":
        where = f"CPU has {native}" if native else "no bf16 support on this CPU: emulated, slower than fp32"
        return "bf16", f"--precision bf16; {where}"
    if requested != "auto":
        raise ValueError(f"--precision {requested!r}: expected auto, bf16 or fp32")
    if train_backend == "megatron":
        return "fp32", "the megatron trainer runs float32 only"
    if native is None:
        return "fp32", "no bf16 support on this CPU"
    return "bf16", f"CPU has {native}"


def concrete(precision: str, train_backend: str = "torch") -> Resolved:
    """`precision` as a process runs it: bf16 or fp32 (an `auto` that reached a process unresolved, e.g. from a
    config built in code, is resolved here over this machine's CPU flags)."""
    if precision == "auto":
        return resolve_precision("auto", read_cpu_flags(), train_backend)[0]
    return "bf16" if precision == "bf16" else "fp32"


def precision_line(value: str, why: str) -> str:
    """The one line a run logs at start: `precision: bf16 (CPU has avx512_bf16)`."""
    return f"precision: {value} ({why})"


def logprob_abs_tol(precision: str, given: float | None) -> float:
    """The --ci-test log-prob checker's bound: `given` (--ci-logprobs-checker-abs-tol), else the precision's."""
    if given is not None:
        return given
    return LOGPROB_ABS_TOL["bf16" if precision == "bf16" else "fp32"]
