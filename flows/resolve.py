"""From the flags to a run that can start: the recipe fills in what the flags leave unset, every path is
checked, the data is read and the reward imported, and the chat template is checked, all before Ray or
Prefect start and before anything is written to the run dir. `rollflow run --dry-run` stops here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from artifacts.checkpoints import latest_checkpoint, model_dir
from config import RunConfig, dump_yaml
from config.precision import precision_line, read_cpu_flags, resolve_precision
from deployments.params import apply_served_defaults
from recipes.registry import get_recipe
from rollout.data import DataError
from rollout.dynamic import check_sampling
from rollout.extensions import ExtensionError
from rollout.plugins import check_plugins
from rollout.source import RolloutSource, rollout_source
from rollout.template import check_examples
from tasks.trackers import require_trackers

# Data flags that only make sense with --prompt-data (the recipe reads its own files with its own keys).
_DATA_KEYS = (
    "input_key",
    "label_key",
    "metadata_key",
    "tool_key",
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "rollout_max_prompt_len",
)


def apply_recipe(cfg: RunConfig, *, build: bool = True) -> RunConfig:
    """Fill in the recipe's base model, prompt data (+ keys), eval data and reward where the flags are unset.
    With `build=False` the recipe's checkpoint is not built (its path is filled in all the same)."""
    recipe = get_recipe(cfg.recipe)
    data, reward = cfg.data, cfg.reward
    given = sorted(k for k in _DATA_KEYS if k in data.model_fields_set)
    if (
        data.prompt_data is None and given
    ):  # refused before the recipe builds its model (a minute, the first time)
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(
            f"{flags} given without --prompt-data: the {recipe.name} preset reads its own prompts "
            f"with its own keys; give --prompt-data to use yours"
        )
    if data.prompt_data is not None and reward.rm_type is None and reward.custom_rm_path is None:
        raise ValueError(
            "--prompt-data is given but no reward: add --rm-type (exact_match, math, deepscaler, f1, "
            "tiny-arith, long-arith, or boxed_<type>) or --custom-rm-path module.fn"
        )
    update: dict[str, Any] = {}
    if cfg.hf_checkpoint is None:
        update["hf_checkpoint"] = str(recipe.built_checkpoint() if build else recipe.checkpoint_path())
    data_update: dict[str, Any] = {}
    if data.prompt_data is None:
        train, evals = recipe.ensure_data()
        preset = {k: v for k, v in recipe.data.items() if k not in data.model_fields_set}
        data_update = {**preset, "prompt_data": str(train)}
        if data.eval_prompt_data is None:
            data_update["eval_prompt_data"] = [recipe.name, str(evals)]
        if reward.rm_type is None and reward.custom_rm_path is None:
            update["reward"] = reward.model_copy(update={"rm_type": recipe.rm_type})
        rollout_preset = {k: v for k, v in recipe.rollout.items() if k not in cfg.rollout.model_fields_set}
        if rollout_preset:
            update["rollout"] = cfg.rollout.model_copy(update=rollout_preset)
    if data_update:
        update["data"] = data.model_copy(update=data_update)
    return RunConfig.model_validate(
        {
            **cfg.model_dump(),
            **{k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in update.items()},
        }
    )


def check_paths(cfg: RunConfig) -> None:
    """Inputs exist (and look like what they should be) before anything starts."""
    ckpt = Path(cfg.hf_checkpoint or "")
    if not (ckpt / "config.json").is_file():
        raise ValueError(f"--hf-checkpoint {cfg.hf_checkpoint}: not an HF model directory (no config.json)")
    _check_model_files(ckpt)
    if cfg.ref_load:
        try:
            ref = model_dir(cfg.ref_load)
        except FileNotFoundError as e:
            raise ValueError(f"--ref-load {e}") from None
        _check_ref_content(cfg.ref_load, ref, verify=not cfg.checkpoint.no_verify_checkpoint)
    if cfg.checkpoint.load:
        _check_checkpoint(cfg.checkpoint.load, verify_content=not cfg.checkpoint.no_verify_checkpoint)
    _check_recordings(cfg)
    _check_writable(cfg)


# a tokenizer loads from one of these (fast tokenizers, SentencePiece, BPE and WordPiece vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# the model dir's JSON files a run reads (the tokenizer's loaders report a damaged one without its name)
MODEL_JSON = (
    "config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def _check_model_files(ckpt: Path) -> None:
    """--hf-checkpoint holds tokenizer files, and each JSON file a run reads parses (named with its line)."""
    if not any((ckpt / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"--hf-checkpoint {ckpt}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): copy the "
            "model's tokenizer into it"
        )
    for name in MODEL_JSON:
        if (ckpt / name).is_file():
            _read_json(ckpt / name)


def _read_json(path: Path) -> Any:
    """The JSON value of `path`; ValueError naming --hf-checkpoint, the file and the line."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"--hf-checkpoint {path.parent}: {path.name}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"--hf-checkpoint {path.parent}: {path.name} line {e.lineno} column {e.colno}: not valid JSON ({e.msg})"
        ) from None


def check_model_args(cfg: RunConfig) -> None:
    """slime's architecture flags (config/arch.py) against the config.json of --hf-checkpoint, when it is there
    (the recipe's model is checked once built), and the model against what the megatron backend can build;
    ValueError naming the flag, both values and the file."""
    from config.arch import check_arch

    path = Path(cfg.hf_checkpoint or "") / "config.json"
    if not path.is_file():
        return
    config = _read_json(path)
    if not isinstance(config, dict):
        return
    if cfg.arch.model_fields_set:
        check_arch(cfg.arch, config, str(path))
    if cfg.train.train_backend == "megatron" and not cfg.rollout_only:
        from trainers.megatron.arch import ModelArch  # config.json only: no megatron import

        try:  # the trainer reads the same config.json when it starts; a model it cannot build is named now
            ModelArch.from_hf_config(config)
        except KeyError as e:
            raise ValueError(f"--train-backend megatron: {path}: no {e.args[0]!r}") from None
        except ValueError as e:
            raise ValueError(f"--train-backend megatron: {path}: {e}") from None


def model_positions(checkpoint: str | None) -> int | None:
    """The model's `max_position_embeddings` from its config.json (None: no config.json yet, or no such key)."""
    path = Path(checkpoint or "") / "config.json"
    if not path.is_file():
        return None
    config = _read_json(path)
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_lengths(cfg: RunConfig, source: RolloutSource) -> None:
    """Each data set's longest prompt plus its response length fits the model's positions; ValueError naming the
    length flag, the file and row of the longest prompt, and the model's bound."""
    positions = model_positions(cfg.hf_checkpoint)
    if positions is None or cfg.train_only:
        return
    r, e = cfg.rollout, cfg.eval
    plans = [("--prompt-data", source.train, "--rollout-max-response-len", r.rollout_max_response_len)]
    eval_flag = "--eval-max-response-len" if e.eval_max_response_len else "--rollout-max-response-len"
    eval_len = e.eval_max_response_len or r.rollout_max_response_len
    plans += [(f"--eval-prompt-data {name}", s, eval_flag, eval_len) for name, s in source.evals]
    for data_flag, prompts, flag, length in plans:
        if prompts is None:
            continue
        longest = max(prompts.prompts, key=lambda p: len(p.tokens))
        need = len(longest.tokens) + length
        if need > positions:
            unit = "line" if prompts.path.endswith(".jsonl") else "row"
            room = positions - len(longest.tokens)
            raise ValueError(
                f"{flag} {length}: the longest prompt of {data_flag} {prompts.path} ({unit} {longest.row}, "
                f"{len(longest.tokens)} tokens) + {length} new tokens = {need} positions, more than the model's "
                f"{positions} (max_position_embeddings in {cfg.hf_checkpoint}/config.json)"
                + (
                    f": at most {room}"
                    if room > 0
                    else ": the prompt alone fills them (--rollout-max-prompt-len)"
                )
            )


def check_labels(cfg: RunConfig, source: RolloutSource) -> None:
    """Every label is of the type the built-in `--rm-type` compares against (a `--custom-rm-path` reward takes
    what it takes); ValueError naming the file, row and key."""
    from rollout.rewards import ANY_LABEL, BOXED, BUILTIN_REWARDS, builtin_reward, label_problem, sample_rule

    rm, d = cfg.reward.rm_type, cfg.data
    if cfg.reward.custom_rm_path is not None or rm is None or rm.removeprefix(BOXED) not in BUILTIN_REWARDS:
        return
    eval_key = d.eval_label_key if d.eval_label_key is not None else d.label_key
    plans = [("--prompt-data", source.train, d.label_key, "--label-key")]
    plans += [(f"--eval-prompt-data {n}", s, eval_key, "--eval-label-key") for n, s in source.evals]
    for data_flag, prompts, key, key_flag in plans:
        if prompts is None:
            continue
        if key is None:
            if rm.removeprefix(BOXED) in ANY_LABEL:  # a coin, a server or the row's metadata needs none
                continue
            raise ValueError(
                f"{data_flag} {prompts.path}: --rm-type {rm} compares each response with a label, but no "
                f"{key_flag} names the row key that holds it"
            )
        unit, known = ("line" if prompts.path.endswith(".jsonl") else "row"), set()
        for p in prompts.prompts:
            rule = sample_rule(p.metadata, rm)
            if rule != rm and rule not in known:  # a row's own rule (slime's metadata rm_type) must exist
                try:
                    builtin_reward(rule)
                except ValueError as e:
                    raise ValueError(f"{data_flag} {prompts.path} {unit} {p.row}: metadata {e}") from None
                known.add(rule)
            why = label_problem(rule, p.label)
            if why:
                raise ValueError(f"{data_flag} {prompts.path} {unit} {p.row}: {key_flag} {key!r}: {why}")


def _check_ref_content(ref_load: str, ref: Path, *, verify: bool) -> None:
    """--ref-load of a --save dir: the weights of its checkpoint `ref` against the content hashes its save recorded
    (an HF dir has none of ours and passes)."""
    from artifacts.content_hashes import verify as verify_content

    problems = verify_content(ref, only=("model.safetensors",)) if verify else None
    if problems:
        file, problem = problems[0]
        raise ValueError(f"--ref-load {ref_load}: {ref / file}: {problem}")


def _check_checkpoint(load: str, verify_content: bool = True) -> None:
    """--load: a missing or empty dir is fine (a first launch), an HF dir too; a checkpoint is linted as
    `rollflow lint-ckpt` lints it (every file its load reads, the weights against config.json, with
    `verify_content` every tensor against its saved content hash), the first problem named with its file. A
    checkpoint saved without content hashes gets a one-line notice."""
    from artifacts.content_hashes import unverified_notice
    from artifacts.lint import lint_checkpoint
    from tasks.notify import notice

    if Path(load).exists() and not Path(load).is_dir():
        raise ValueError(f"--load {load}: not a directory (give a --save dir or one of its iter_N dirs)")
    path = latest_checkpoint(load)
    if path is None:
        return
    report = lint_checkpoint(path, verify_content)
    problems = report.problems
    if problems:
        more = f" (and {len(problems) - 1} more: rollflow lint-ckpt {path})" if len(problems) > 1 else ""
        raise ValueError(f"--load {load}: {path / problems[0].where}: {problems[0].message}{more}")
    if report.unverified:
        notice(f"--load {unverified_notice(path)}")


def _check_recordings(cfg: RunConfig) -> None:
    """Recordings a run will read exist, and the first of them reads (format, checksum, pickling policy)."""
    from artifacts.slime_format import read_any
    from tasks.recordings import read_limits, recording_path

    d, r = cfg.debug, cfg.rollout
    plans = []
    if d.load_debug_rollout_data:
        plans.append(("--load-debug-rollout-data", d.load_debug_rollout_data, range(r.num_rollout), False))
    if d.ci_inject_rollout_data_path:
        plans.append(
            (
                "--ci-inject-rollout-data-path",
                d.ci_inject_rollout_data_path,
                range(d.ci_inject_rollout_data_start_rollout_id, r.num_rollout),
                False,
            )
        )
    if d.load_forge_rollout_data:
        plans.append(("--load-forge-rollout-data", d.load_forge_rollout_data, range(r.num_rollout), True))
    for flag, template, ids, fallback in plans:
        paths = []
        for rid in ids:
            try:
                paths.append(recording_path(template, rid, fallback_to_zero=fallback))
            except FileNotFoundError as e:
                raise ValueError(f"{flag}: {e}") from None
            if "{rollout_id}" not in template:
                break  # a literal path: one file for every rollout
        if paths:
            try:
                read_any(paths[0], trust_pickle=d.trust_pickle, limits=read_limits(cfg))
            except Exception as e:  # the reader's errors name the file and what is wrong with it
                raise ValueError(f"{flag}: {' '.join(str(e).split())}") from None


def _check_writable(cfg: RunConfig) -> None:
    """Every output location can be created and written (artifacts.atomic.check_writable)."""
    from artifacts.atomic import check_writable

    outputs = [
        ("--run-dir", str(cfg.resolved_run_dir)),
        ("--save", cfg.checkpoint.save),
        ("--dump-details", cfg.debug.dump_details),
        ("--optimizer-offload-dir", cfg.train.optimizer_offload_dir),
    ]
    for flag, template in (
        ("--save-debug-rollout-data", cfg.debug.save_debug_rollout_data),
        ("--save-debug-train-data", cfg.debug.save_debug_train_data),
        ("--ci-save-grad-norm", cfg.ci.ci_save_grad_norm),
    ):
        if template:
            outputs.append((flag, str(Path(template).parent)))
    for flag, where in outputs:
        if not where:
            continue
        try:
            check_writable(where)
        except OSError as e:
            raise ValueError(f"{flag} {where}: cannot be written ({e.strerror or e})") from None


def resolve(cfg: RunConfig, *, build: bool = True, tokenizer: Any = None) -> tuple[RunConfig, RolloutSource]:
    """The run's resolved config and data side; raises ValueError naming the flag, file, row or token.
    In a deployment's flow run the served defaults are merged under the given fields first."""
    cfg = apply_served_defaults(cfg)
    require_trackers(cfg.logging)  # a missing W&B / TensorBoard package is refused here, naming the extra
    given = cfg.hf_checkpoint is not None
    cfg = apply_recipe(cfg, build=build)
    cfg = with_precision(cfg)
    if build or given:
        check_paths(cfg)
    check_model_args(cfg)
    try:
        source = rollout_source(cfg, tokenizer=tokenizer)
        # the trainers import it again; a bad path is named here, before anything starts
        if cfg.loss.loss_type == "custom_loss":
            from trainers.custom_loss import resolve_loss

            resolve_loss(cfg.loss.loss_type, cfg.loss.custom_loss_function_path)
        check_sampling(cfg)
        check_plugins(cfg)
    except (DataError, ExtensionError) as e:
        raise ValueError(str(e)) from None
    if cfg.data.apply_chat_template and source.train is not None:
        check_template_of(source)
    check_labels(cfg, source)
    check_lengths(cfg, source)
    if cfg.ray_address is None:  # a cluster's resources are known once it is reached (tasks/placement.place)
        from tasks.placement import LOCAL, cluster_problem, local_cluster

        why = cluster_problem(cfg, local_cluster(cfg), 1, LOCAL)
        if why:
            raise ValueError(why)
    return cfg, source


def with_precision(cfg: RunConfig, flags: frozenset[str] | None = None) -> RunConfig:
    """`cfg` with --precision auto resolved (config/precision.py) over `flags` (default: this CPU's), once, before
    anything starts: config.yaml, the engines and the trainers see bf16 or fp32."""
    if cfg.train.precision != "auto":
        return cfg
    value, _ = resolve_precision(
        "auto", read_cpu_flags() if flags is None else flags, cfg.train.train_backend
    )
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"precision": value})})


def precision_notice(cfg: RunConfig, flags: frozenset[str] | None = None) -> str | None:
    """The start-up line naming the precision a run takes and why (`precision: bf16 (CPU has avx512_bf16)`), for a
    run that asks for anything but the default fp32 (whose runs print what they always did)."""
    if cfg.train.precision == "fp32":
        return None
    flags = read_cpu_flags() if flags is None else flags
    return precision_line(*resolve_precision(cfg.train.precision, flags, cfg.train.train_backend))


def check_template_of(source: RolloutSource, examples: int = 3) -> None:
    """The chat-template check on the first prompts of the training data; raises on the first mismatch."""
    assert source.train is not None
    pairs = [
        (list(p.messages), _response_for(p.label, source))
        for p in source.train.prompts[:examples]
        if p.messages is not None
    ]
    for result in check_examples(source.tokenizer, pairs, source.stops):
        if result.problems:
            raise ValueError(
                f"chat template check failed (rollflow check-template shows the details): "
                f"{result.problems[0]}"
            )


def _response_for(label: Any, source: RolloutSource) -> str:
    """An assistant reply to render in the check: the label when the tokenizer encodes it faithfully."""
    tok = source.tokenizer
    if isinstance(label, str) and label and tok.decode(tok.encode(label, add_special_tokens=False)) == label:
        return label
    from rollout.template import _probe_text

    return _probe_text(tok)


def describe(cfg: RunConfig, source: RolloutSource) -> str:
    """The dry run's report: the resolved config and what the data resolved to."""
    lines = [dump_yaml(cfg).rstrip(), "", "# resolved data"]
    sets = ([("train", source.train)] if source.train else []) + [(f"eval/{n}", s) for n, s in source.evals]
    for name, s in sets:
        first = s.prompts[0]
        lines.append(
            f"{name}: {s.path}: {s.rows} rows, {len(s.prompts)} prompts"
            + (f" ({s.dropped_long} dropped: longer than --rollout-max-prompt-len)" if s.dropped_long else "")
            + f"; first prompt ({len(first.tokens)} tokens): {first.text!r}, label {first.label!r}"
        )
    lines.append(
        f"reward: {source.scorer.name}; stop token ids {list(source.stops.ids)}"
        + (f", stop strings {list(source.stops.strings)}" if source.stops.strings else "")
    )
    if not Path(cfg.hf_checkpoint or "").is_dir():
        lines.append(f"hf_checkpoint {cfg.hf_checkpoint} does not exist yet: the first run builds it")
    return "\n".join(lines)
