"""Every metric name a run records in metrics.jsonl (and hands to W&B and TensorBoard), with the record kind that
carries it and what it means. docs/reference/metrics.md is generated from METRICS, and an e2e test checks that
every key a real run logs is one of these names: a metric added to the code without a line here fails it."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric name. `<part>` in `name` stands for a part that varies (an eval set, a process, a reason);
    `plugin` names a key a user's plug-in chooses, which no run of rollflow's own code can be checked against."""

    name: str
    kind: str  # the metrics.jsonl record kind: rollout, step, perf, eval or check
    meaning: str
    plugin: bool = False

    def matches(self, key: str) -> bool:
        parts = re.split(r"<[^>]+>", self.name)
        return re.fullmatch("[^/]+".join(re.escape(p) for p in parts), key) is not None


# slime's names where slime logs the metric; the order is the page's
METRICS: tuple[Metric, ...] = (
    Metric("rollout/raw_reward", "rollout", "Mean reward of the rollout's samples."),
    Metric("rollout/response_lengths", "rollout", "Mean response length in tokens."),
    Metric("rollout/response_len/max", "rollout", "Longest response of the rollout, in tokens."),
    Metric("rollout/response_len/min", "rollout", "Shortest response of the rollout, in tokens."),
    Metric("rollout/response_len/median", "rollout", "Median response length, in tokens."),
    Metric("rollout/truncated_ratio", "rollout", "Share of samples cut at --rollout-max-response-len."),
    Metric("rollout/failed_ratio", "rollout", "Share of samples whose reward function raised."),
    Metric("rollout/failed_count", "rollout", "Samples whose reward function raised."),
    Metric(
        "rollout/zero_std/count_<reward>",
        "rollout",
        "Groups whose valid samples all got this reward (rounded to 0.1): no advantage, no gradient.",
    ),
    Metric("rollout/log_probs", "rollout", "Mean trainer log-prob of the response tokens (loss mask)."),
    Metric("rollout/ref_log_probs", "rollout", "Mean reference-model log-prob of the response tokens."),
    Metric("rollout/rollout_log_probs", "rollout", "Mean engine log-prob of the response tokens."),
    Metric(
        "rollout/entropy", "rollout", "Mean entropy of the trainer's token distribution on the responses."
    ),
    Metric("rollout/dynamic_sampling/draws", "rollout", "Draws of --over-sampling-batch-size groups taken."),
    Metric("rollout/dynamic_sampling/drawn_groups", "rollout", "Groups drawn by dynamic sampling."),
    Metric("rollout/dynamic_sampling/kept_groups", "rollout", "Groups the dynamic sampling filter kept."),
    Metric(
        "rollout/dynamic_sampling/dropped_groups", "rollout", "Groups the dynamic sampling filter dropped."
    ),
    Metric(
        "rollout/dynamic_filter/drop_<reason>",
        "rollout",
        "Groups dropped for this reason (the filter's DynamicFilterOutput.reason).",
    ),
    Metric("train/step", "step", "The optimizer step (slime's step key of train records)."),
    Metric("train/loss", "step", "The loss minimised: pg_loss, minus the entropy term, plus the KL term."),
    Metric("train/pg_loss", "step", "Policy-gradient loss."),
    Metric("train/pg_clipfrac", "step", "Share of tokens where the clipped ratio term was taken."),
    Metric("train/ppo_kl", "step", "Mean old-policy minus new-policy log-prob (approximate KL of the step)."),
    Metric("train/entropy_loss", "step", "Mean token entropy (the term --entropy-coef weighs)."),
    Metric("train/kl_loss", "step", "KL to the reference model (--use-kl-loss, --kl-loss-type)."),
    Metric(
        "train/train_rollout_logprob_abs_diff",
        "step",
        "Mean |trainer log-prob - engine log-prob| on the response tokens, before the step.",
    ),
    Metric("train/grad_norm", "step", "Gradient norm before clipping (--clip-grad)."),
    Metric("train/lr-pg_0", "step", "Learning rate of the step."),
    Metric(
        "train/<key>",
        "step",
        "A metric a --custom-loss-function-path loss returns under <key> (e.g. cispo_clipfrac).",
        plugin=True,
    ),
    Metric("eval/step", "eval", "slime's eval step: the rollout whose weights the eval ran on."),
    Metric("eval/<name>", "eval", "Mean reward on the eval set <name> (e.g. eval/tiny-arith)."),
    Metric("eval/<name>-truncated_ratio", "eval", "Share of eval responses cut at the length limit."),
    Metric("perf/step_time", "perf", "Seconds of the whole rollout (all its stages)."),
    Metric("perf/rollout_time", "perf", "Seconds of the generate stage."),
    Metric("perf/tokens_per_sec", "perf", "Generated tokens per second over all engines."),
    Metric("perf/tokens_per_engine_per_sec", "perf", "Generated tokens per second per engine."),
    Metric("perf/longest_sample_tokens_per_sec", "perf", "Tokens of the longest response per second."),
    Metric("perf/log_probs_time", "perf", "Seconds of the trainer's log-prob pass."),
    Metric("perf/ref_log_probs_time", "perf", "Seconds of the reference model's log-prob pass."),
    Metric("perf/actor_train_time", "perf", "Seconds of the train step."),
    Metric(
        "perf/mem_rss_gb/<process>",
        "perf",
        "Resident memory (GiB) of driver, rollout, engine-<i>, trainer-<rank>, or their total.",
    ),
    Metric("perf/mem_peak_gb/<process>", "perf", "Highest resident memory (GiB) of the process so far."),
    Metric("check/finite_metrics", "check", "1: every metric of the rollout was finite."),
    Metric("check/engines_in_sync", "check", "1: every engine holds the trainer's weights and version."),
    Metric("check/weight_version", "check", "The weight version the engines hold after the rollout's sync."),
    Metric(
        "check/weight_update_equal",
        "check",
        "--ci-test: 1 when the engines' weights equal the trainer's per tensor after the update, 0 otherwise.",
    ),
    Metric("check/violations", "check", "Checker violations of the rollout (the run stops on any)."),
    Metric(
        "check/metric_gate",
        "check",
        "--ci-metric-checker-key gate at the end of the run: 1 passed, 0 failed.",
    ),
    Metric(
        "check/generate_deterministic",
        "check",
        "--ci-test: 1 when re-generated requests gave the same tokens.",
    ),
    Metric(
        "check/log_prob_deterministic",
        "check",
        "--ci-test: 1 when the re-executed log-prob pass was bitwise equal.",
    ),
    Metric(
        "check/train_step_deterministic",
        "check",
        "--ci-test: 1 when the re-executed train-step micro-batch was bitwise equal.",
    ),
    Metric(
        "check/inject_mean_match_ratio", "check", "Injected rollout: mean token match with the fresh one."
    ),
    Metric("check/inject_min_match_ratio", "check", "Injected rollout: the worst sample's token match."),
    Metric("check/inject_num_samples", "check", "Injected rollout: samples compared."),
)


def metric_of(key: str, *, plugins: bool = True) -> Metric | None:
    """The METRICS entry `key` is an instance of (an exact name before a pattern); None when there is none.
    `plugins=False` leaves out the names a plug-in chooses."""
    candidates = [m for m in METRICS if plugins or not m.plugin]
    exact = [m for m in candidates if m.name == key]
    if exact:
        return exact[0]
    return next((m for m in candidates if "<" in m.name and m.matches(key)), None)
