"""Doctor rules over what a run left on disk besides its metric series: the prompt tokens against the run's
tokenizer, the checkpoints (checkpoint lint), the checkers' records, and how far the run got."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from artifacts.store import ArtifactError, read_metadata
from flows.doctor.findings import DIRECT, SYMPTOM, Finding
from flows.doctor.run_data import RunData


def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _first_difference(recorded: list[int], expected: list[int]) -> int:
    return next(
        (i for i, (a, b) in enumerate(zip(recorded, expected, strict=False)) if a != b),
        min(len(recorded), len(expected)),
    )


def prompt_tokens(run: RunData) -> list[Finding]:
    """Re-tokenize every distinct prompt text of the examined rollouts with the run's tokenizer
    (`--hf-checkpoint`, `encode(text, add_special_tokens=False)`, as the engine's prompts are made) and compare
    with the recorded `prompt_tokens`. The trainer scores the recorded tokens. When its tokenizer and template
    would not produce them (a recording from another tokenizer or template, a tokenizer changed mid-run), the
    model trains on token sequences it will never see at inference. The first differing token is named."""
    if not run.rollout_ids:
        return []
    hf = run.cfg("hf_checkpoint")
    if not hf:
        return [
            Finding(
                "info",
                "prompt tokens not checked: config.yaml names no hf_checkpoint",
                "-",
                "-",
                "prompt-tokens",
                SYMPTOM,
            )
        ]
    try:
        tokenizer = _tokenizer(str(hf))
    except Exception as e:  # any loader failure (missing dir, no tokenizer files) only means: cannot check
        return [
            Finding(
                "info",
                f"prompt tokens not checked: no tokenizer loads from {hf}",
                f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
                "-",
                "prompt-tokens",
                SYMPTOM,
            )
        ]
    where: dict[tuple[str, tuple[int, ...]], tuple[int, int]] = {}
    for rid in run.examined_ids:
        for s in run.samples(rid) or []:
            where.setdefault((s.prompt, tuple(s.prompt_tokens)), (rid, s.sample_index))
    keys = list(where)
    if not keys:
        return []
    encoded = tokenizer([text for text, _ in keys], add_special_tokens=False)["input_ids"]
    wrong = [(key, list(ids)) for key, ids in zip(keys, encoded, strict=True) if list(key[1]) != list(ids)]
    if not wrong:
        return []
    (text, recorded), expected = wrong[0]
    rid, index = where[(text, recorded)]
    pos = _first_difference(list(recorded), expected)

    def token(ids: list[int] | tuple[int, ...]) -> str:
        return (
            f"{ids[pos]} ({tokenizer.convert_ids_to_tokens(int(ids[pos]))!r})"
            if pos < len(ids)
            else "the end"
        )

    recording = run.cfg("debug.load_debug_rollout_data") or run.cfg("debug.load_forge_rollout_data")
    title = (
        "the recorded prompt tokens are not what the run's tokenizer makes of the prompt text: the recording was "
        "tokenized with another tokenizer or chat template"
        if recording
        else "the engine was given other prompt tokens than the trainer's tokenizer makes of the prompt text: the "
        "chat template or tokenizer on the engine's side differs from the trainer's"
    )
    return [
        Finding(
            "error",
            title,
            f"{len(wrong)} of {len(keys)} distinct prompts in {len(run.examined_ids)} examined rollout(s); "
            f"first: rollout {rid} sample_index {index}, prompt token {pos}: recorded {token(recorded)}, "
            f"{hf} gives {token(expected)} ({len(recorded)} vs {len(expected)} tokens)",
            f"rollflow check-template --hf-checkpoint {hf} --prompt-data FILE (renders and tokenizes prompts "
            f"as the engine gets them); rollflow inspect {run.paths.rollout(rid)} --fields prompt,prompt_tokens",
            "prompt-tokens",
            DIRECT,
        )
    ]


def _checkpoint_dirs(run: RunData) -> list[Path]:
    """The run's latest saved checkpoint and its --hf-checkpoint (those that exist)."""
    from artifacts.lint import INDEX_FILE, SINGLE_FILE

    def is_model(d: Path) -> bool:
        return (d / SINGLE_FILE).is_file() or (d / INDEX_FILE).is_file()

    out = []
    save = run.cfg("checkpoint.save")
    if save and Path(str(save)).is_dir():
        iters = sorted(p for p in Path(str(save)).glob("iter_*") if p.is_dir() and is_model(p))
        out += iters[-1:]
    hf = run.cfg("hf_checkpoint")
    if hf and is_model(Path(str(hf))):
        out.append(Path(str(hf)))
    return out


def checkpoints(run: RunData) -> list[Finding]:
    """Checkpoint lint (artifacts.lint) of the latest checkpoint the run saved and of its --hf-checkpoint: a
    missing shard, a tensor in the wrong shard, a wrong dtype or shape, tied embeddings that differ, a
    quantised lm_head. Each is a defect of the files themselves, so the finding is an error."""
    from artifacts.lint import CheckpointNotFound, lint_checkpoint

    out = []
    for d in _checkpoint_dirs(run):
        try:
            report = lint_checkpoint(d)
        except CheckpointNotFound:
            continue
        if report.problems:
            shown = "; ".join(str(p) for p in report.problems[:5])
            more = f" (+{len(report.problems) - 5} more)" if len(report.problems) > 5 else ""
            out.append(
                Finding(
                    "error",
                    f"checkpoint {d} is inconsistent: {report.problems[0]}",
                    f"{len(report.problems)} problem(s) in {report.files} file(s), {report.tensors} "
                    f"tensors: {shown}{more}",
                    f"rollflow lint-ckpt {d}",
                    "checkpoint-lint",
                    DIRECT,
                )
            )
    return out


_CHECKS = {
    "check/weight_update_equal": (
        "the weight-update checker failed at the first sync: some engine tensors are not "
        "the trainer's after the transfer (a dropped, renamed or mis-converted tensor)",
        "rollflow run --check-weight-update-equal --num-rollout 1 names every differing tensor, by layer",
    ),
    "check/metric_gate": (
        "the accuracy gate failed: no eval reached --ci-metric-checker-threshold",
        "the eval/* records of metrics.jsonl",
    ),
}  # the checks that log their failure as a 0 (the others raise before logging: their violations are counted)


def checker_failures(run: RunData) -> list[Finding]:
    """The run's own checkers that recorded a failure in metrics.jsonl (a pass flag at 0, or --ci-test
    violations). The checker's message (in the run's log) has the detail; the record only says where. Violations
    of the rollout whose CheckFailed the run recorded as its failure are left to `run_end.failure`, which has the
    message."""
    out = []
    o = run.outcome
    failed_at = (
        o.where if o is not None and not o.gate and (o.error or "").startswith("CheckFailed") else None
    )
    for r in run.records:
        if r["kind"] != "check":
            continue
        rid = r["rollout_id"]
        for key, value in r["metrics"].items():
            if key in _CHECKS and value == 0:
                title, knife = _CHECKS[key]
                out.append(
                    Finding("error", title, f"{key} = {value} at rollout {rid}", knife, "checker", SYMPTOM)
                )
            elif failed_at is not None and failed_at.startswith(f"rollout {rid}, "):
                continue
            elif key == "check/violations" and isinstance(value, int | float) and value > 0:
                out.append(
                    Finding(
                        "error",
                        f"{int(value)} --ci-test checker violation(s) at rollout {rid}",
                        f"{key} = {value} at rollout {rid}",
                        f"the run's error line names checker, metric, value and tolerance; rollflow replay "
                        f"{run.dir} --rollout-id {rid} --task check",
                        "checker",
                        SYMPTOM,
                    )
                )
    return out


def run_extent(run: RunData) -> list[Finding]:
    """How far the run got (info): rollouts recorded vs --num-rollout, and metrics.jsonl lines that could not
    be used (torn by a crash)."""
    out = []
    n, ids = run.cfg("rollout.num_rollout"), run.rollout_ids
    if isinstance(n, int) and (not ids or ids[-1] + 1 < n):
        exit_after = run.cfg("debug.debug_exit_after_rollout")
        why = (
            f"--debug-exit-after-rollout {exit_after}"
            if exit_after
            else "a failure (the findings above, the run's last log line) or an interrupted run"
        )
        upto = f"rollouts up to {ids[-1]}" if ids else "no rollout"
        out.append(
            Finding(
                "info",
                f"the run recorded {upto} of --num-rollout {n}: it stopped early ({why})",
                f"{len(ids)} rollout recording(s) in {run.dir}/rollouts",
                "-",
                "run-extent",
                SYMPTOM,
            )
        )
    if run.unusable_lines:
        out.append(
            Finding(
                "info",
                f"metrics.jsonl has {run.unusable_lines} unusable line(s) (torn by a crash?)",
                str(run.paths.metrics),
                "-",
                "run-extent",
                SYMPTOM,
            )
        )
    return out


def unreadable(run: RunData) -> list[Finding]:
    """Recordings that failed their checksum or schema check while the other rules read them (run last)."""
    return [
        Finding(
            "error", f"{path} is corrupt or unreadable", why, f"rollflow inspect {path}", "artifact", DIRECT
        )
        for path, why in sorted(run.unreadable.items())
    ]


# an SGLang --sglang-dtype value -> the precision it computes at (auto, the checkpoint's own dtype, is not told)
_SGLANG_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
}


def _engine_precision(run: RunData, rollout_id: int) -> tuple[str, str] | None:
    """(precision, where it is recorded) of the engines that generated a rollout: the rollout file's metadata, or
    that of the recording it was loaded from; None when neither records one."""
    path = run.paths.rollout(rollout_id)
    try:
        meta = read_metadata(path)
    except (ArtifactError, OSError):
        return None
    if isinstance(meta.get("precision"), str):
        return meta["precision"], str(path)
    recorded = meta.get("recorded_from")
    if isinstance(recorded, str) and recorded.endswith(".parquet"):
        try:
            precision = read_metadata(recorded).get("precision")
        except (ArtifactError, OSError):
            return None
        if isinstance(precision, str):
            return precision, recorded
    return None


def precision_mismatch(run: RunData) -> list[Finding]:
    """The engine side and the trainer compute at different precisions (bf16 vs fp32). The trainer's log-probs
    then differ from the engine's by the precision, every rollout. The log-prob checker's bound, set by the
    trainer's --precision, no longer describes the pair. Evidence: an SGLang engine's --sglang-dtype against
    --precision, or the precision a rollout file records for its engines against the trainer's (a recording
    made at another precision and replayed by this run's trainer)."""
    trainer = str(run.cfg("train.precision", "fp32"))
    server_args = run.cfg("sglang.sglang_server_args", {})
    dtype = server_args.get("dtype") if isinstance(server_args, dict) else None
    if run.cfg("rollout.rollout_backend") == "sglang" and isinstance(dtype, str):
        engine = _SGLANG_DTYPES.get(dtype.lower())
        if engine is not None and engine != trainer:
            return [
                Finding(
                    "error",
                    f"the SGLang engines compute in {dtype} but the trainer at {trainer}: their log-probs of the "
                    "same tokens differ by the precision",
                    f"config.yaml: sglang.sglang_server_args.dtype = {dtype}, train.precision = {trainer}",
                    f"drop --sglang-dtype (the run passes --precision {trainer} to the engines) or set --precision "
                    "to the engines' precision",
                    "precision-mismatch",
                    DIRECT,
                )
            ]
    for rid in run.examined_ids:
        found = _engine_precision(run, rid)
        if found is not None and found[0] != trainer:
            engine, where = found
            replayed = " (a recording)" if where != str(run.paths.rollout(rid)) else ""
            return [
                Finding(
                    "error",
                    f"rollout {rid} was generated by engines at {engine}{replayed} but the trainer computes at "
                    f"{trainer}: their log-probs of the same tokens differ by the precision",
                    f"{where}: precision {engine}; config.yaml: train.precision = {trainer}",
                    f"rerun with --precision {engine}, or record the rollouts again at --precision {trainer}",
                    "precision-mismatch",
                    DIRECT,
                )
            ]
    return []
