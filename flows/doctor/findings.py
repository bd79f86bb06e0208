"""What `rollflow doctor` reports: findings with a severity, the evidence and the knife that confirms them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

# How directly a finding's evidence implicates its cause; findings of one severity are ranked by it.
DIRECT = 0  # the evidence is the broken part itself (a non-finite value, a missing shard, an empty label)
POINTED = 1  # the evidence points at one cause (ppo_kl != 0 at a first step, a log-prob gap from rollout R)
SYMPTOM = 2  # a symptom several causes share (a spike, entropy drift, a checker that only logged "failed")


@dataclass(frozen=True)
class Finding:
    """One thing `rollflow doctor` found wrong with a run.

    `title` names the cause (what is broken, and the likely reasons), `evidence` the metric, rollout, step
    and value that show it, `knife` the command or flag that confirms it (slime's method: cut the loop,
    record, replay), `rule` the id of the rule that fired, `directness` one of DIRECT / POINTED / SYMPTOM."""

    severity: Severity
    title: str
    evidence: str
    knife: str
    rule: str
    directness: int = POINTED


def ranked(findings: list[Finding]) -> list[Finding]:
    """Findings by severity (error, warning, info), then by directness; ties keep the rules' order."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.directness))


def exit_code(findings: list[Finding], strict: bool = False) -> int:
    """1 when any finding is an error (with `strict`, also a warning), else 0.

    Warnings do not fail by default: they are symptoms that a healthy run can show too (lengths that grow in
    reasoning RL, entropy that falls as the policy sharpens). Errors are states no healthy run is in."""
    failing = {"error", "warning"} if strict else {"error"}
    return 1 if any(f.severity in failing for f in findings) else 0


def format_findings(findings: list[Finding], run_dir: str | None = None) -> str:
    """The findings as `rollflow doctor` prints them, ranked: a header line with the counts, then per finding
    its severity and title, the evidence and the knife; `no findings` when there is none."""
    findings = ranked(findings)
    head = f"rollflow doctor {run_dir}: " if run_dir else ""
    if not findings:
        return f"{head}no findings"
    counts = ", ".join(
        f"{n} {s}{'s' if n > 1 else ''}" for s in SEVERITIES if (n := sum(f.severity == s for f in findings))
    )
    lines = [
        f"{head}{len(findings)} finding{'s' if len(findings) > 1 else ''} ({counts}), most likely cause first"
    ]
    for i, f in enumerate(findings, start=1):
        lines += [
            f"{i}. {f.severity.upper()} [{f.rule}] {f.title}",
            f"   evidence: {f.evidence}",
            f"   confirm:  {f.knife}",
        ]
    return "\n".join(lines)
