"""`rollflow doctor RUN_DIR`: name what is wrong with a run.

Reads config.yaml, metrics.jsonl, the recordings and the checkpoints of a run directory and returns
ranked findings, each with its evidence (metric, rollout, value) and the knife that confirms it. The
rules automate the precision and sanity checklist of slime / miles / Relax's debug guides (see
`signals` and `artifact_rules`; each rule's docstring says what it checks and why its bound holds).

API (for a caller such as the end of a `--ci-test` run): `diagnose(run_dir) -> list[Finding]`,
`format_findings(findings)`, `exit_code(findings)`, `gate_failure(findings)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flows.doctor import artifact_rules, run_end, signals
from flows.doctor.findings import SYMPTOM, Finding, Severity, exit_code, format_findings, ranked
from flows.doctor.run_data import DoctorInputError, RunData

__all__ = [
    "DoctorInputError",
    "Finding",
    "Severity",
    "diagnose",
    "exit_code",
    "format_findings",
    "gate_failure",
]

Rule = Callable[[RunData], list[Finding]]

# The order breaks ties between findings of one severity and directness: the more specific rule first.
RULES: tuple[Rule, ...] = (
    signals.non_finite,
    signals.constant_rewards,
    signals.zero_gradient,
    artifact_rules.prompt_tokens,
    artifact_rules.precision_mismatch,
    signals.first_step_precision,
    signals.logprob_gap,
    signals.truncation,
    artifact_rules.checkpoints,
    artifact_rules.checker_failures,
    run_end.failure,
    run_end.faults,
    signals.spikes,
    signals.entropy,
    signals.length_drift,
    signals.eval_vs_reward,
    artifact_rules.run_extent,
    artifact_rules.unreadable,  # last: it reports what the rules before it could not read
)


def _apply(rule: Rule, run: RunData) -> list[Finding]:
    try:
        return rule(run)
    except Exception as e:  # one rule tripping over an odd run must not hide the others' findings
        return [
            Finding(
                "info",
                f"the {rule.__name__} check could not run on this run",
                f"{type(e).__name__}: {e}",
                "-",
                rule.__name__.replace("_", "-"),
                SYMPTOM,
            )
        ]


def diagnose(run_dir: str | Path) -> list[Finding]:
    """Every finding of every rule on the run at `run_dir`, ranked (severity, then how directly the evidence
    implicates the cause). Raises `DoctorInputError` (one line naming the file) when the directory has no
    readable config.yaml or metrics.jsonl."""
    run = RunData(run_dir)
    return ranked([f for rule in RULES for f in _apply(rule, run)])


def gate_failure(findings: list[Finding]) -> str | None:
    """The line a `--ci-test` run fails with when the doctor found an error (`--ci-doctor gate`): the first
    error's rule, title and evidence, and how many more there are; None when no finding is an error."""
    errors = [f for f in ranked(findings) if f.severity == "error"]
    if not errors:
        return None
    first, more = errors[0], len(errors) - 1
    return (
        f"the doctor found an ERROR [{first.rule}] {first.title} (evidence: {first.evidence})"
        + (f"; {more} more error(s) in `rollflow doctor`" if more else "")
        + " (--ci-doctor advisory reports without failing)"
    )
