"""Doctor rules over the signals a run already logs (metrics.jsonl) and its recordings.

Each rule automates one item of the precision and sanity checklist of slime / miles / Relax's debug guides
and returns findings. No threshold is tuned to one machine's floats: bounds are either the anchors' own
(the checkers' tolerances, read from the run's config) or principled (an order of magnitude, a majority,
two standard errors of the run's own noise), and each rule's docstring says why.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from typing import Any

from config.precision import TOKEN_ABS_DIFF_TOL, logprob_abs_tol
from flows.doctor.findings import DIRECT, POINTED, SYMPTOM, Finding
from flows.doctor.run_data import RunData, ids, mean_and_se, windows


def _replay_knife(run: RunData, rollout_id: int, flags: str = "") -> str:
    return (
        f"train that rollout again from its recording: rollflow run --load-debug-rollout-data "
        f"{run.dir}/rollouts/rollout_{{rollout_id}}.parquet{flags} (--load the checkpoint saved before rollout "
        f"{rollout_id}), or rollflow replay {run.dir} --rollout-id {rollout_id} --task train-step (needs "
        "--save-interval 1)"
    )


def _inspect(run: RunData, rollout_id: int, fields: str = "prompt,response,label,reward,status") -> str:
    return f"rollflow inspect {run.paths.rollout(rollout_id)} --fields {fields}"


# -- non-finite values -------------------------------------------------------------------------------------
def non_finite(run: RunData) -> list[Finding]:
    """Any NaN or infinite metric, or reward in the examined recordings. No healthy run has one: the first
    is where the run broke, and everything after it is noise."""
    bad = [
        (r, k, v)
        for r in run.records
        for k, v in r["metrics"].items()
        if isinstance(v, float) and not math.isfinite(v)
    ]
    rewards = [
        (rid, s) for rid in run.examined_ids for s in (run.samples(rid) or []) if not math.isfinite(s.reward)
    ]
    if not bad and not rewards:
        return []
    if bad:
        r, key, value = bad[0]
        where = f"rollout {r['rollout_id']}" + (f" step {r['step']}" if r.get("step") is not None else "")
        keys = sorted({k for _, k, _ in bad})
        title = f"{key} is {value} at {where}: the first non-finite value of the run"
        evidence = (
            f"{len(bad)} non-finite metric value(s) ({', '.join(keys[:6])}); the first in a "
            f"'{r['kind']}' record at {where}"
        )
        if r["kind"] == "step" or key.startswith("rollout/log"):
            return [
                Finding(
                    "error",
                    title + " (training diverged: LR, loss scale, a bad sample)",
                    evidence,
                    _replay_knife(run, r["rollout_id"]),
                    "non-finite",
                    DIRECT,
                )
            ]
        return [Finding("error", title, evidence, _inspect(run, r["rollout_id"]), "non-finite", DIRECT)]
    rid, s = rewards[0]
    return [
        Finding(
            "error",
            f"the reward is {s.reward} for sample_index {s.sample_index} of rollout {rid}: the "
            "reward function returned a non-finite number",
            f"{len(rewards)} sample(s) with a non-finite reward in the examined rollouts",
            _inspect(run, rid),
            "non-finite",
            DIRECT,
        )
    ]


# -- rewards and gradient ----------------------------------------------------------------------------------
def constant_rewards(run: RunData) -> list[Finding]:
    """Every group of every examined rollout has identical rewards. GRPO's advantage is the reward minus its
    group's mean, so it is exactly zero everywhere: nothing is learned (and the gradient is zero). The cause
    is told apart by what the samples show: empty labels (the label key), one reward for everything (the
    reward ignores the response), or identical responses within each group (sampling, not the reward)."""
    groups, constant, identical, labels, total = 0, 0, 0, 0, 0
    rewards: Counter[float] = Counter()
    for rid in run.examined_ids:
        by_group: dict[int, list[Any]] = {}
        for s in run.samples(rid) or []:
            by_group.setdefault(s.group_index, []).append(s)
            rewards[s.reward] += 1
            labels += s.label.strip() == ""
            total += 1
        for members in by_group.values():
            if len(members) < 2:
                continue
            groups += 1
            constant += len({m.reward for m in members}) == 1
            identical += len({tuple(m.response_tokens) for m in members}) == 1
    if not groups or constant < groups:
        return []
    grads = [v for _, _, v in run.steps("train/grad_norm")]
    grad_note = f"; train/grad_norm = 0 at all {len(grads)} step(s)" if grads and not any(grads) else ""
    values = ", ".join(f"{r}: {n}" for r, n in rewards.most_common(3))
    evidence = (
        f"{constant} of {groups} groups in {len(run.examined_ids)} examined rollout(s) have identical "
        f"rewards (reward: samples = {values}); {labels} of {total} labels empty{grad_note}"
    )
    knife = (
        f"{_inspect(run, run.examined_ids[0])}, call the reward on one row, then check the fix with "
        "rollflow run --debug-rollout-only --num-rollout 1 (rollout/zero_std/count_* must fall below the "
        "number of groups)"
    )
    if labels == total:
        title = "every label is empty, so every reward is the same: the label key is wrong (--label-key)"
        return [Finding("error", title, evidence, knife, "constant-reward", DIRECT)]
    if len(rewards) == 1:
        title = (
            f"every sample gets reward {next(iter(rewards))}: the reward function ignores the response "
            "(--rm-type / --custom-rm-path / --reward-key, or labels that never match: --label-key)"
        )
        return [Finding("error", title, evidence, knife, "constant-reward", POINTED)]
    if identical == groups:
        title = (
            "the samples of every group are identical, so rewards are too: sampling is greedy or seeded "
            "alike (--rollout-temperature, --rollout-top-k)"
        )
        return [
            Finding(
                "error",
                title,
                evidence,
                _inspect(run, run.examined_ids[0], "group_index,response,reward"),
                "constant-reward",
                POINTED,
            )
        ]
    title = (
        "rewards are identical within every group (they differ only between prompts): the reward depends on "
        "the prompt, not the response (reward function, --label-key)"
    )
    return [Finding("error", title, evidence, knife, "constant-reward", POINTED)]


def zero_gradient(run: RunData) -> list[Finding]:
    """train/grad_norm is exactly 0 at every step while rewards do vary within groups (that case is
    `constant_rewards`): the loss does not reach the weights. An all-zero loss mask is named directly."""
    grads = run.steps("train/grad_norm")
    if not grads or any(v for _, _, v in grads):
        return []
    if constant_rewards(run):
        return []  # explained there: zero advantages give a zero gradient
    masks = [s for rid in run.examined_ids for s in (run.samples(rid) or [])]
    empty = sum(1 for s in masks if not any(s.loss_mask))
    evidence = f"train/grad_norm = 0 at all {len(grads)} step(s) (rollouts {grads[0][0]}-{grads[-1][0]})"
    if masks and empty == len(masks):
        return [
            Finding(
                "error",
                "every sample's loss_mask is all zeros: no token is trained on (loss mask / chat "
                "template: rollflow check-template prints the mask)",
                evidence + f"; loss_mask all zero in {empty} of {len(masks)} samples",
                "rollflow check-template --hf-checkpoint HF_DIR --prompt-data FILE",
                "zero-gradient",
                DIRECT,
            )
        ]
    return [
        Finding(
            "error",
            "the gradient is exactly zero although rewards vary: advantages or the loss are "
            "zeroed before the backward pass",
            evidence,
            "rollflow run --dump-details DIR writes each rank's batch as trained (advantages, "
            "loss mask) under DIR/train_data/",
            "zero-gradient",
            POINTED,
        )
    ]


# -- trainer vs engine: precision, template, weights -------------------------------------------------------
def _worst_token(run: RunData, rollout_id: int) -> str:
    """The response token where trainer and engine log-probs differ most in a rollout ('' when unknown)."""
    samples, rows = run.samples(rollout_id), run.logprob_rows(rollout_id)
    if not samples or not rows:
        return ""
    worst = (0.0, "")
    for s in samples:
        lp = (rows.get(s.sample_index) or {}).get("log_probs")
        if not lp or len(s.rollout_log_probs) != len(lp):
            continue
        for pos, (a, b, m) in enumerate(zip(lp, s.rollout_log_probs, s.loss_mask, strict=False)):
            if m and abs(a - b) > worst[0]:
                worst = (
                    abs(a - b),
                    f"; worst token: sample_index {s.sample_index}, response position {pos} "
                    f"(id {s.response_tokens[pos]}): trainer {a:.4f}, engine {b:.4f}",
                )
    return worst[1]


def logprob_gap(run: RunData) -> list[Finding]:
    """Trainer vs engine log-probs of the same tokens (seeds' checklist: precision, template, weights).

    A rollout is off when |rollout/log_probs - rollout/rollout_log_probs| reaches the run's own
    --ci-logprobs-checker-abs-tol (by default its precision's, config/precision.py: miles' 0.03 for fp32) or the
    first step's train/train_rollout_logprob_abs_diff reaches slime's
    --ci-train-rollout-logprob-abs-diff-threshold (0.1).
    When is the tell: off at the run's first rollout, where trainer and engines start from the same
    checkpoint, means the two compute differently (dtype, kernels, tokens or template); agreeing first and
    drifting apart later means the engines stopped getting the trainer's weights."""
    precision = str(run.cfg("train.precision", "fp32"))
    given = run.cfg("ci.ci_logprobs_checker_abs_tol")
    tol = logprob_abs_tol(precision, None if given is None else float(given))
    trainer, engine = (
        dict(run.per_rollout("rollout/log_probs")),
        dict(run.per_rollout("rollout/rollout_log_probs")),
    )
    firsts = run.first_steps()
    abs_diff = {
        rid: v for rid, step, v in run.steps("train/train_rollout_logprob_abs_diff") if step in firsts
    }
    gaps = {rid: abs(trainer[rid] - engine[rid]) for rid in trainer.keys() & engine.keys()}
    rollouts = sorted(gaps.keys() | abs_diff.keys())
    bad = [
        rid for rid in rollouts if gaps.get(rid, 0.0) >= tol or abs_diff.get(rid, 0.0) >= TOKEN_ABS_DIFF_TOL
    ]
    if not bad:
        return []
    first = bad[0]
    evidence = (
        f"|rollout/log_probs - rollout/rollout_log_probs| = {gaps.get(first, float('nan')):.4g} at rollout "
        f"{first} (tolerance {tol} at {precision}, --ci-logprobs-checker-abs-tol); first-step "
        f"train/train_rollout_logprob_abs_diff = {abs_diff.get(first, float('nan')):.4g} (slime: < "
        f"{TOKEN_ABS_DIFF_TOL}); off in {len(bad)} of {len(rollouts)} rollouts{_worst_token(run, first)}"
    )
    check = "rollflow run --check-weight-update-equal --num-rollout 1"
    recording = run.cfg("debug.load_debug_rollout_data")
    if (
        recording and first == rollouts[0]
    ):  # train-only: the "engine" side is whatever generated the recording
        title = (
            f"the trainer's log-probs disagree with the recording's from rollout {first} on: the recording "
            f"({recording}) was generated by other weights than the trainer starts from (--load, --ref-load, "
            "--hf-checkpoint), or with another tokenizer or template"
        )
        knife = f"rollflow inspect {recording.replace('{rollout_id}', str(first))} --fields weight_version,seed,prompt"
        return [Finding("error", title, evidence, knife, "logprob-gap", POINTED)]
    if first == rollouts[0]:
        title = (
            f"trainer and engine log-probs disagree from the first rollout ({first}) on, before any weight "
            "update: they compute differently (precision/dtype, kernels), see other tokens (chat template, "
            "tokenizer), or the engine loaded other weights"
        )
        knife = (
            f"{check} proves the engine holds the trainer's weights bitwise; if it passes, compare dtypes and "
            "the template: rollflow check-template --hf-checkpoint HF_DIR"
        )
        return [Finding("error", title, evidence, knife, "logprob-gap", POINTED)]
    title = (
        f"trainer and engine log-probs agree at rollout {rollouts[0]} but not from rollout {first} on: the "
        "engines stop receiving the trainer's weights (the weight sync is broken or skipped)"
    )
    knife = (
        f"rollflow replay {run.dir} --rollout-id {first - 1} --task sync (with the checkpoints of --save-interval 1) "
        f"pushes the weights after rollout {first - 1} again and compares the engine's own hash with them: it fails "
        f"for a transfer that does not apply ({check} checks only the run's first sync)"
    )
    return [Finding("error", title, evidence, knife, "logprob-gap", POINTED)]


def _dropout(run: RunData) -> str:
    """`attention_dropout = 0.3` when the model config turns a dropout on ('' otherwise)."""
    on = [
        (k, v)
        for k, v in sorted(run.model_config.items())
        if "dropout" in k and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    ]
    return ", ".join(f"{k} = {v}" for k, v in on)


def first_step_precision(run: RunData) -> list[Finding]:
    """At the first optimizer step of a rollout the policy is the one that just computed the old log-probs,
    so ppo_kl and pg_clipfrac are 0 bitwise (miles' KL checker: |ppo_kl| < 1e-9, |clipfrac| < 1e-10); and at
    the run's start the actor equals the reference (|log_probs - ref_log_probs| < 1e-8). Not holding means a
    forward that is not deterministic: dropout left on (named from the model's config.json when so), or
    batch-dependent kernels. Skipped with --use-rollout-logprobs (the old log-probs are the engine's)."""
    if run.cfg("train.use_rollout_logprobs", False):
        return []
    firsts = run.first_steps()
    kl = [(rid, step, v) for rid, step, v in run.steps("train/ppo_kl") if step in firsts and abs(v) >= 1e-9]
    clip = [
        (rid, step, v)
        for rid, step, v in run.steps("train/pg_clipfrac")
        if step in firsts and abs(v) >= 1e-10
    ]
    out = []
    dropout = _dropout(run)
    cause = (
        f"dropout is on in the model ({dropout} in {run.cfg('hf_checkpoint')}/config.json)"
        if dropout
        else "the trainer's forward is not deterministic (dropout, batch-dependent kernels)"
    )
    if kl or clip:
        rid, step, v = (kl or clip)[0]
        metric = "train/ppo_kl" if kl else "train/pg_clipfrac"
        out.append(
            Finding(
                "error",
                f"{metric} is not 0 at the first step of rollout {rid}: {cause}",
                f"{metric} = {v:.3g} at rollout {rid} step {step} (must be 0: |x| < 1e-9); "
                f"{len(kl)} first step(s) with ppo_kl != 0 of {len(firsts)}",
                f"rollflow replay {run.dir} --rollout-id {rid} --task log-prob (it also passes the rollout a "
                "second time in one process, the RNG advanced: it differs for a forward that depends on the RNG, "
                "such as a seeded dropout); rollflow run --ci-test checks every first step",
                "first-step-kl",
                DIRECT if dropout else POINTED,
            )
        )
    lp, ref = dict(run.per_rollout("rollout/log_probs")), dict(run.per_rollout("rollout/ref_log_probs"))
    # --ci-test holds any run to it (the log-probs checker), else only a run that starts from the reference
    same_start = run.cfg("ci.ci_test", False) or not (run.cfg("checkpoint.load") or run.cfg("ref_load"))
    if same_start and 0 in lp and 0 in ref and abs(lp[0] - ref[0]) >= 1e-8:
        out.append(_reference_not_start(run, lp[0], ref[0], cause, dropout))
    return out


def _start_weights(run: RunData) -> dict[str, str]:
    """The trainer's record of the starting and reference models' weights_sha256 ({} when not recorded)."""
    try:
        data = json.loads(run.paths.start_weights.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _reference_not_start(run: RunData, lp: float, ref: float, cause: str, dropout: str) -> Finding:
    """Actor and reference log-probs differ at rollout 0 of a fresh run, where both should be the starting model:
    the recorded weight hashes tell a reference loaded from other weights (the direct cause, ranked first) from a
    forward that is not deterministic (confirmed by a replay whose second in-process pass, RNG moved on, must
    give the same log-probs)."""
    evidence = (
        f"rollout/log_probs = {lp:.6g}, rollout/ref_log_probs = {ref:.6g} at rollout 0 (same weights: must "
        "agree within 1e-8)"
    )
    hashes = _start_weights(run)
    start, reference = hashes.get("start"), hashes.get("reference")
    if start and reference and start != reference:
        return Finding(
            "error",
            "actor and reference log-probs differ before any training: the reference is not the starting model "
            f"(its weights hash to {reference[:12]}, the starting model's to {start[:12]})",
            f"{evidence}; {run.paths.start_weights}: reference sha256 {reference}, start sha256 {start}",
            "rollflow run --ci-test --num-rollout 1 records both hashes again in start_weights.json: they differ "
            "until the reference is loaded from the starting model's weights (--ref-load, --hf-checkpoint, --load)",
            "first-step-kl",
            DIRECT,
        )
    known = f"; the reference and starting weights hash alike ({start[:12]})" if start else ""
    return Finding(
        "error",
        f"actor and reference log-probs differ before any training: {cause}",
        evidence + known,
        f"rollflow replay {run.dir} --rollout-id 0 --task log-prob (it passes the rollout twice in one process, "
        "the RNG advanced in between: a forward that depends on the RNG, such as a seeded dropout, differs)",
        "first-step-kl",
        DIRECT if dropout or start else POINTED,
    )


# -- entropy, spikes ---------------------------------------------------------------------------------------
def entropy(run: RunData) -> list[Finding]:
    """rollout/entropy against its own start e0. Collapse: it falls below e0 / 10 (an order of magnitude: the
    policy turned near-deterministic). Blow-up: it rises more than halfway from e0 to ln(vocab size), the
    entropy of uniformly random tokens (the policy is dissolving into noise). Both are judged on the
    extremes, so a collapse that later recovers is still reported."""
    values = run.per_rollout("rollout/entropy")
    if len(values) < 2 or values[0][1] <= 0:
        return []
    (r0, e0), (r_min, e_min), (r_max, e_max) = (
        values[0],
        min(values, key=lambda x: x[1]),
        max(values, key=lambda x: x[1]),
    )
    knife = "plot rollout/entropy with train/ppo_kl and train/grad_norm from metrics.jsonl; " + _replay_knife(
        run, r_min if e_min < e0 / 10 else r_max, " --lr LOWER"
    )
    out = []
    if e_min < e0 / 10:
        out.append(
            Finding(
                "warning",
                f"entropy collapsed from {e0:.3g} to {e_min:.3g}: the policy became "
                "near-deterministic (LR too high, no entropy bonus, reward hacking)",
                f"rollout/entropy = {e0:.4g} at rollout {r0}, {e_min:.4g} at rollout {r_min} "
                f"(below a tenth of the start)",
                knife,
                "entropy",
                SYMPTOM,
            )
        )
    vocab = run.model_config.get("vocab_size")
    if isinstance(vocab, int) and vocab > 1 and e_max > e0 + (math.log(vocab) - e0) / 2:
        out.append(
            Finding(
                "warning",
                f"entropy blew up from {e0:.3g} to {e_max:.3g}, more than halfway to random "
                f"tokens (ln {vocab} = {math.log(vocab):.3g}): LR too high, or the engines sample "
                "from wrong weights",
                f"rollout/entropy = {e0:.4g} at rollout {r0}, {e_max:.4g} at rollout {r_max}",
                knife,
                "entropy",
                SYMPTOM,
            )
        )
    return out


_SPIKE_FACTOR = 10  # an order of magnitude above the steps just before
_SPIKE_HISTORY = 8  # steps needed before a step can be judged
_SPIKE_WINDOW = 64  # steps the median is taken over


def _spike(
    values: list[tuple[int, int, float]], floor: float
) -> tuple[int, int, float, float, int, int] | None:
    """(rollout, step, value, median before it, steps that median is over, number of spikes) of the first
    spike, or None."""
    found, count = None, 0
    for i in range(_SPIKE_HISTORY, len(values)):
        before = values[max(0, i - _SPIKE_WINDOW) : i]
        median = statistics.median(abs(v) for _, _, v in before)
        rid, step, v = values[i]
        if median > 0 and abs(v) >= _SPIKE_FACTOR * median and abs(v) >= floor:
            count += 1
            found = found or (rid, step, v, median, len(before))
    return (*found, count) if found else None


def spikes(run: RunData) -> list[Finding]:
    """train/grad_norm, train/ppo_kl and train/kl_loss against the median of the (up to 64) steps before: a
    step at 10x that median or more is a spike. Each step is judged by its recent past (8 steps at least). So a
    run's start, where KL is large by nature, does not count, and heavy tails (a clean default run peaks at
    about 4x its recent median) do not fire. KL values under 1% of the clip range (eps_clip / 100) are ignored:
    a policy that moved that little cannot destabilise PPO. ppo_kl skips every rollout's first step (0 by
    construction)."""
    firsts = run.first_steps()
    floor = float(run.cfg("train.eps_clip", 0.2)) / 100
    out = []
    for key, min_value in (("train/grad_norm", 0.0), ("train/ppo_kl", floor), ("train/kl_loss", floor)):
        values = [
            x
            for x in run.steps(key)
            if math.isfinite(x[2]) and not (key == "train/ppo_kl" and x[1] in firsts)
        ]
        hit = _spike(values, min_value)
        if hit is None:
            continue
        rid, step, v, median, window, count = hit
        out.append(
            Finding(
                "warning",
                f"{key} spikes to {v:.3g} at rollout {rid} step {step}, "
                f"{abs(v) / median:.0f}x the median of the steps before it: a bad batch or "
                "an unstable update (LR, clipping, a sample far off-policy)",
                f"{key} = {v:.4g} at step {step}, median {median:.4g} over the {window} steps "
                f"before; {count} such step(s)",
                f"{_inspect(run, rid)}; {_replay_knife(run, rid)}",
                "spike",
                SYMPTOM,
            )
        )
    return out


# -- lengths and truncation --------------------------------------------------------------------------------
def _truncation_cause(
    run: RunData, stops: list[int] | None, max_len: object, high: set[int]
) -> tuple[str, int]:
    """Why responses run into the max length, told apart by the examined recordings, and how directly."""

    def emitted(rollouts: list[int]) -> set[int]:
        return {t for i in rollouts for s in (run.samples(i) or []) for t in s.response_tokens}

    if stops == []:
        return "no stop token ids are set, so a response can only end at the max length", DIRECT
    if stops:
        before = [i for i in run.examined_ids if i not in high and i < min(high, default=0)]
        if not emitted(run.examined_ids) & set(stops):
            return (
                f"the model never produces the stop token(s) {stops}: it ends its turns with another token "
                "(the chat template's end-of-turn? --rollout-stop-token-ids)"
            ), POINTED
        if high and before and emitted(before) & set(stops) and not emitted(sorted(high)) & set(stops):
            return (
                f"the model stopped producing the stop token(s) {stops} at rollout {min(high)} (it did before): "
                "training unlearned the end of a turn (LR too high, a reward that favours long answers)"
            ), POINTED
    return f"the answers need more than --rollout-max-response-len {max_len} tokens", POINTED


def truncation(run: RunData) -> list[Finding]:
    """rollout/truncated_ratio (and every eval/<name>-truncated_ratio) above 0.9: nine responses in ten run
    into the max length instead of stopping. In most rollouts it is an error (the run trains on cut-off
    text), in some a warning. The recordings tell the cause: no stop token ids at all, stop ids the model
    never produces (its end-of-turn is another token), stop ids it produced and then unlearned (training
    broke it), or a max length too short for the answers."""
    values = run.per_rollout("rollout/truncated_ratio")
    evals = [
        (r["rollout_id"], k, float(v))
        for r in run.records
        if r["kind"] == "eval"
        for k, v in r["metrics"].items()
        if k.endswith("-truncated_ratio") and isinstance(v, int | float)
    ]
    high = [(rid, v) for rid, v in values if v > 0.9]
    high_evals = [(rid, k, v) for rid, k, v in evals if v > 0.9]
    if not high and not high_evals:
        return []
    most = bool(values) and statistics.median(v for _, v in values) > 0.9
    rid = high[0][0] if high else (run.rollout_ids or [0])[0]
    sampling = run.sampling(rid) if run.rollout_ids else {}
    stops = sampling.get("stop_token_ids")
    max_len = sampling.get("max_new_tokens", run.cfg("rollout.rollout_max_response_len"))
    cause, direct = _truncation_cause(run, stops, max_len, {r for r, _ in high})
    shown = (
        [
            f"rollout/truncated_ratio > 0.9 in {len(high)} of {len(values)} rollouts (first: {high[0][1]:.3g} at "
            f"rollout {high[0][0]})"
        ]
        if high
        else []
    )
    shown += [f"{k} = {v:.3g} at eval {r}" for r, k, v in high_evals[:2]]
    evidence = "; ".join(shown) + f"; stop ids {stops}, max length {max_len}"
    title = f"responses are cut at the max length instead of stopping: {cause}"
    knife = (
        f"{_inspect(run, rid, 'response,response_tokens,status')}; rollflow check-template --hf-checkpoint "
        "HF_DIR prints the stop ids the engine uses"
    )
    return [Finding("error" if most else "warning", title, evidence, knife, "truncation", direct)]


def _trend(
    values: list[tuple[int, float]],
) -> tuple[tuple[float, float], tuple[float, float], str, str] | None:
    """((mean, se) of the first quarter, (mean, se) of the last quarter, their rollout ranges), or None."""
    w = windows(values)
    if w is None:
        return None
    a, b = w
    return mean_and_se([v for _, v in a]), mean_and_se([v for _, v in b]), ids(a), ids(b)


def _significant(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two means differ by more than two standard errors of their difference."""
    return abs(b[0] - a[0]) > 2 * math.hypot(a[1], b[1])


def length_drift(run: RunData) -> list[Finding]:
    """Mean response length of the last quarter of the rollouts vs the first (8 rollouts at least): doubled or
    halved, by more than two standard errors of the rollout-to-rollout noise. Lengths that grow can be
    healthy (reasoning gets longer), so this is a warning; growth heads for truncation, shrinking for
    answers that stop before they say anything."""
    t = _trend(run.per_rollout("rollout/response_lengths"))
    if t is None:
        return []
    (m1, se1), (m2, se2), w1, w2 = t
    if m1 <= 0 or not (m2 >= 2 * m1 or m2 <= m1 / 2) or not _significant((m1, se1), (m2, se2)):
        return []
    if m2 > m1:
        what = (
            "doubled: verbosity or repetition is rewarded, and responses head for the max length "
            "(truncation follows)"
        )
    else:
        what = "halved: the reward favours short answers, or the stop token became too likely"
    return [
        Finding(
            "warning",
            f"response lengths {what}",
            f"rollout/response_lengths: mean {m1:.3g} in {w1}, {m2:.3g} in {w2}",
            _inspect(run, run.rollout_ids[-1] if run.rollout_ids else 0, "response,response_length,reward"),
            "length-drift",
            SYMPTOM,
        )
    ]


# -- eval vs reward ----------------------------------------------------------------------------------------
def _eval_point(run: RunData, eval_id: int, name: str, value: float) -> tuple[float, float] | None:
    """(eval value, its standard error from the eval recording's per-sample rewards), None without them."""
    samples = [s for s in (run.eval_samples(eval_id) or []) if s.metadata.get("eval_dataset", name) == name]
    if len(samples) < 2:
        return None
    return value, statistics.stdev(s.reward for s in samples) / math.sqrt(len(samples))


def eval_vs_reward(run: RunData) -> list[Finding]:
    """The training reward rises (last quarter of rollouts vs first, beyond two standard errors of the
    rollout-to-rollout noise) while an eval falls (last eval vs first, beyond two standard errors taken from
    the eval recordings' per-sample rewards): the policy learns something that does not carry over
    (reward hacking, overfitting to the training prompts)."""
    t = _trend(run.per_rollout("rollout/raw_reward"))
    if t is None or not (t[1][0] > t[0][0] and _significant(t[0], t[1])):
        return []
    out = []
    evals = [r for r in run.records if r["kind"] == "eval"]
    names = sorted(
        {
            k
            for r in evals
            for k in r["metrics"]
            if k.startswith("eval/") and k != "eval/step" and not k.endswith("-truncated_ratio")
        }
    )
    for key in names:
        points = sorted((r["rollout_id"], float(r["metrics"][key])) for r in evals if key in r["metrics"])
        if len(points) < 2:
            continue
        (i0, v0), (i1, v1) = points[0], points[-1]
        first, last = _eval_point(run, i0, key[5:], v0), _eval_point(run, i1, key[5:], v1)
        if first is None or last is None or not (v1 < v0 and _significant(first, last)):
            continue
        out.append(
            Finding(
                "warning",
                f"{key} falls while the training reward rises: reward hacking or overfitting "
                "to the training prompts",
                f"{key} {v0:.3g} at eval {i0} -> {v1:.3g} at eval {i1} (se {first[1]:.2g}, {last[1]:.2g}); "
                f"rollout/raw_reward {t[0][0]:.3g} in {t[2]} -> {t[1][0]:.3g} in {t[3]}",
                f"{_inspect(run, run.rollout_ids[-1] if run.rollout_ids else 0)} (the high-reward "
                f"answers: do they solve the task?) vs rollflow inspect {run.paths.eval_rollout(i1)}",
                "eval-vs-reward",
                SYMPTOM,
            )
        )
    return out
