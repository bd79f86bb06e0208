"""slime's generation plug-ins, called with slime's signatures in the run's rollout actor:

- `--custom-generate-function-path`: `async def generate(args, sample, sampling_params) -> Sample` (an
  `evaluation` keyword is passed when the function takes one), called once per sample in place of one engine
  call. It generates through rollout.engine_client, as many times as it likes (multi-turn, tool calls), and
  appends what it gets to the sample: the model's tokens with loss mask 1 and their log-probs, a tool's or
  environment's tokens with loss mask 0 (`sample.append_response_tokens(tokens=..., trainable=False)`), so the
  trainer's loss covers the model's own tokens only.
- `--rollout-function-path`: `generate_rollout(args, rollout_id, data_source, evaluation=False)` (sync, run on a
  worker thread, or async) replaces the whole rollout's generation: it takes groups of pending samples from
  `data_source.get_samples(n)` and returns the groups it generated (a list of groups, or an object with
  `.samples`, as slime's RolloutFnTrainOutput). It may use `generate_and_rm` below for each sample.

Whatever a plug-in returns is scored (a sample whose `reward` it set keeps it) and written as the rollout's
Parquet file like any rollout, so every later stage, and `rollflow replay` of them, reads it as usual.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout import engine_client
from rollout.engine_client import EngineClient
from rollout.extensions import load_function
from rollout.finish import Tally, write_finished
from rollout.rewards import Scorer
from rollout.sample import Sample
from rollout.scoring import score_samples
from rollout.source import scoring_side

if TYPE_CHECKING:
    from artifacts.store import ArtifactRef
    from config import RunConfig
    from rollout.requests import Entry

# slime's default --rollout-function-path: its own generation, which is rollflow's here
SLIME_DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"


class PluginError(RuntimeError):
    """A plug-in returned something rollflow cannot train on; the message names the plug-in and the sample."""


def rollout_function_path(cfg: RunConfig) -> str | None:
    """The run's --rollout-function-path, None for rollflow's own generation (also slime's default path)."""
    path = cfg.rollout.rollout_function_path
    return None if path in (None, SLIME_DEFAULT_ROLLOUT) else path


def uses_plugins(cfg: RunConfig) -> bool:
    """Whether the run generates through a plug-in (the rollout actor then calls the engines itself)."""
    return bool(cfg.rollout.custom_generate_function_path or rollout_function_path(cfg))


def sampling_params(cfg: RunConfig, eval_mode: bool = False) -> dict[str, Any]:
    """slime's sampling_params dict for one sample (SGLang's names), from the run's rollout (or eval) flags."""
    from rollout.slime_args import slime_args

    return sampling_params_of(slime_args(cfg), eval_mode)


def sampling_params_of(args: Any, evaluation: bool = False) -> dict[str, Any]:
    """`sampling_params` from slime's `args` (what a rollout function has): the eval flags with `evaluation`,
    where set."""

    def pick(name: str) -> Any:
        value = getattr(args, f"eval_{name}", None) if evaluation else None
        return value if value is not None else getattr(args, f"rollout_{name}")

    return {
        "temperature": pick("temperature"),
        "top_p": pick("top_p"),
        "top_k": pick("top_k"),
        "max_new_tokens": pick("max_response_len"),
        "stop": list(args.rollout_stop or []),
        "stop_token_ids": list(args.rollout_stop_token_ids or []),
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


@dataclass
class _Context:
    """What generate_and_rm needs besides its arguments: the run's generate function, reward and engines."""

    generate_fn: Callable[..., Any] | None
    scorer: Scorer
    num_engines: int
    evaluation: bool


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """rollflow's single-turn generation as slime's `generate`: one engine call from `sample.tokens` (the prompt)
    with what is left of `max_new_tokens`, appended to the sample."""
    if not sample.tokens:
        raise PluginError(f"sample {sample.index}: no prompt tokens to generate from")
    params = dict(sampling_params)
    params["max_new_tokens"] = int(params["max_new_tokens"]) - sample.response_length
    if params["max_new_tokens"] <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    out = await engine_client.generate(args, {"input_ids": sample.tokens, "sampling_params": params})
    pairs = out["meta_info"]["output_token_logprobs"]
    sample.append_response_tokens(
        args,
        tokens=[t for _, t, _ in pairs],
        log_probs=[lp for lp, _, _ in pairs],
        meta_info=out["meta_info"],
        text=out["text"],
    )
    return sample


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample:
    """Generate `sample` (with the run's --custom-generate-function-path, else `generate`) and score it with the
    run's reward, as slime's `generate_and_rm`; for use inside a rollout function. A failed reward marks the
    sample failed with its error in `metadata["reward_error"]`."""
    ctx = engine_client.current_client().plugin_context
    if not isinstance(ctx, _Context):
        raise PluginError("generate_and_rm works inside a --rollout-function-path call made by rollflow")
    token = engine_client.for_sample(sample.seed or 0, (sample.group_index or 0) % ctx.num_engines)
    try:
        sample = await _call_generate(
            ctx.generate_fn or generate, args, sample, sampling_params, ctx.evaluation
        )
    finally:
        engine_client.reset_sample(token)
    if sample.reward is None and sample.status is not Sample.Status.ABORTED:
        scored = (await score_samples(ctx.scorer, [sample]))[0]
        sample.reward = scored.reward
        if scored.error is not None:
            sample.status, sample.metadata["reward_error"] = Sample.Status.FAILED, scored.error
    return sample


async def _call_generate(
    fn: Callable[..., Any], args: Any, sample: Sample, params: dict[str, Any], evaluation: bool
) -> Sample:
    """`fn(args, sample, params)` (with `evaluation=` when it takes it), checked to give back one Sample."""
    takes_eval = "evaluation" in inspect.signature(fn).parameters
    out = (
        fn(args, sample, dict(params), evaluation=evaluation)
        if takes_eval
        else fn(args, sample, dict(params))
    )
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, list) and len(out) == 1:
        out = out[0]
    if isinstance(out, list):
        raise PluginError(
            f"--custom-generate-function-path {getattr(fn, '__name__', fn)} returned {len(out)} samples for sample "
            f"{sample.index}: rollflow trains on one sample per generate call; return one Sample"
        )
    if not isinstance(out, Sample):
        raise PluginError(
            f"--custom-generate-function-path {getattr(fn, '__name__', fn)} returned {type(out).__name__} for "
            f"sample {sample.index}: expected rollout.sample.Sample (slime's Sample)"
        )
    return out


class DataSource:
    """slime's data source for a rollout function: the rollout's prompt groups, each `n_samples_per_prompt`
    pending samples, handed out in order (`get_samples`) and taken back (`add_samples`)."""

    def __init__(self, groups: list[list[Sample]], batch_size: int) -> None:
        self._groups = groups
        self._batch_size = batch_size

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next `num_samples` groups (copies: what a rollout function does with them stays its own)."""
        if num_samples > len(self._groups):
            raise PluginError(
                f"the rollout function asked for {num_samples} more prompt groups but the rollout has "
                f"{len(self._groups)} left of --rollout-batch-size {self._batch_size}"
            )
        taken, self._groups = self._groups[:num_samples], self._groups[num_samples:]
        return [[copy.deepcopy(s) for s in g] for g in taken]

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Give groups back, to be handed out first."""
        self._groups = [list(g) for g in samples] + self._groups


async def plugged_samples(
    cfg: RunConfig,
    rollout_id: int,
    entries: list[Entry],
    client: EngineClient,
    scorer: Scorer,
    *,
    eval_mode: bool = False,
) -> list[Sample]:
    """The samples of rollout `rollout_id` (one per entry, in entry order) generated by the run's plug-ins
    through `client`, which must be entered (the caller's `with client:`). Not yet scored unless a plug-in
    scored them."""
    from rollout.requests import pending_sample
    from rollout.slime_args import slime_args

    args = slime_args(cfg)
    gen_path = cfg.rollout.custom_generate_function_path
    fn = load_function(gen_path, "--custom-generate-function-path") if gen_path else None
    client.plugin_context = _Context(fn, scorer, len(client.engines), eval_mode)
    try:
        path = rollout_function_path(cfg)
        if path and not eval_mode:
            return await _rollout_function(path, args, rollout_id, entries)
        params = sampling_params(cfg, eval_mode)
        assert fn is not None, (
            "plugged_samples needs --custom-generate-function-path or --rollout-function-path"
        )

        async def one(e: Entry) -> Sample:
            token = engine_client.for_sample(e.request.seed, e.group_index % len(client.engines))
            try:
                return await _call_generate(fn, args, pending_sample(e), params, eval_mode)
            finally:
                engine_client.reset_sample(token)

        return list(await asyncio.gather(*(one(e) for e in entries)))
    finally:
        client.plugin_context = None


async def _rollout_function(path: str, args: Any, rollout_id: int, entries: list[Entry]) -> list[Sample]:
    from rollout.requests import pending_sample

    fn = load_function(path, "--rollout-function-path")
    groups: dict[int, list[Sample]] = {}
    for e in entries:
        groups.setdefault(e.group_index, []).append(pending_sample(e))
    source = DataSource(list(groups.values()), len(groups))
    if inspect.iscoroutinefunction(fn):
        out = await fn(args, rollout_id, source, evaluation=False)
    else:
        out = await asyncio.to_thread(fn, args, rollout_id, source, evaluation=False)
    returned = getattr(out, "samples", out)
    flat = (
        [s for g in returned for s in (g if isinstance(g, list) else [g])]
        if isinstance(returned, list)
        else None
    )
    if flat is None or not all(isinstance(s, Sample) for s in flat):
        raise PluginError(
            f"--rollout-function-path {path} returned {type(returned).__name__}: expected groups (lists) of "
            "rollout.sample.Sample, or an object whose .samples holds them"
        )
    by_index = {s.index: s for s in flat}
    wanted = [e.sample_index for e in entries]
    missing = sorted(set(wanted) - set(by_index))
    extra = sorted(set(by_index) - set(wanted), key=str)
    if missing or extra or len(by_index) != len(flat):
        raise PluginError(
            f"--rollout-function-path {path} returned {len(flat)} samples for rollout {rollout_id}: every sample "
            f"of its {len(groups)} prompt groups must come back once (missing indices {missing[:5]}, unknown "
            f"{extra[:5]}{', duplicates' if len(by_index) != len(flat) else ''})"
        )
    return [by_index[i] for i in wanted]


def generation_seconds(client: EngineClient, began: float) -> float:
    """The longest engine's time generating for the rollout (the wall time when no engine was called)."""
    return max(client.seconds.values(), default=time.perf_counter() - began)


async def plugged_rollout(
    cfg: RunConfig,
    rollout_id: int,
    entries: list[Entry],
    engines: list[Any],
    weight_version: int,
    weights_sha256: str,
    path: str,
    *,
    eval_mode: bool = False,
    ctx: dict[str, Any] | None = None,
) -> tuple[ArtifactRef, Tally]:
    """Generate rollout `rollout_id` with the run's plug-ins on `engines` (every call on `weight_version`), score
    it and write it to `path` as rollout/finish.py writes the run's own (same rows, same file metadata)."""
    from rollout.requests import scored_rows

    began = time.perf_counter()
    tokenizer, stops, scorer, eval_scorer = scoring_side(cfg)
    used = eval_scorer if eval_mode else scorer
    client = EngineClient(engines, weight_version, ctx or {}, tokenizer, stops, max_len=_context_length(cfg))
    with client:
        samples = await plugged_samples(cfg, rollout_id, entries, client, used, eval_mode=eval_mode)
    generated = generation_seconds(client, began)
    scoring = time.perf_counter()
    rows = await scored_rows(
        entries,
        samples,
        used,
        rollout_id,
        group_rm=cfg.reward.group_rm and not eval_mode,
        weight_version=weight_version,
    )
    ref, tally = write_finished(
        cfg, rollout_id, rows, weights_sha256, path, eval_mode=eval_mode, began=scoring
    )
    return ref, dataclasses.replace(tally, generation=generated)


def _context_length(cfg: RunConfig) -> int | None:
    """The model's max_position_embeddings (its config.json), None when it does not say."""
    try:
        config = json.loads((Path(cfg.hf_checkpoint or "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None
