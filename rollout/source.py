"""Everything the orchestrator needs to build and score a rollout, resolved once per process from a
resolved run config: tokenizer, stop conditions, training prompts, eval datasets, reward functions."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from engines.base import SamplingParams
from rollout.data import Keys, PromptSet, load_prompts, tokenizer_at
from rollout.rewards import Scorer
from rollout.slime_args import slime_args
from rollout.template import Stops, resolve_stops

if TYPE_CHECKING:
    from config import RunConfig


@dataclass(frozen=True)
class RolloutSource:
    """The data side of one run (see the module docstring)."""

    tokenizer: Any
    stops: Stops
    train: PromptSet | None
    evals: tuple[tuple[str, PromptSet], ...]
    scorer: Scorer
    eval_scorer: Scorer


def train_keys(cfg: RunConfig) -> Keys:
    d = cfg.data
    return Keys(
        d.input_key,
        d.label_key,
        d.metadata_key,
        d.tool_key,
        d.apply_chat_template,
        json.dumps(d.apply_chat_template_kwargs, sort_keys=True),
        d.rollout_max_prompt_len,
    )


def eval_keys(cfg: RunConfig) -> Keys:
    d = cfg.data
    return Keys(
        d.eval_input_key or d.input_key,
        d.eval_label_key if d.eval_label_key is not None else d.label_key,
        d.metadata_key,
        d.tool_key,
        d.apply_chat_template,
        json.dumps(d.apply_chat_template_kwargs, sort_keys=True),
        None,
    )


_SOURCES: dict[str, RolloutSource] = {}
_T = TypeVar("_T")


def rollout_source(cfg: RunConfig, tokenizer: Any = None) -> RolloutSource:
    """The run's data side (cached per process by the config's hash; the files by their identity).
    `tokenizer` stands in for the checkpoint's when that is not built yet (a dry run)."""
    if tokenizer is not None:
        return _source(cfg, tokenizer)
    return cached(_SOURCES, cfg.config_hash(), lambda: _source(cfg, None))


def cached(cache: dict[str, _T], key: str, make: Callable[[], _T]) -> _T:
    """`cache[key]`, made on first use; a process holds a few configs' worth at most (tests run many)."""
    if key not in cache:
        if len(cache) > 4:
            cache.clear()
        cache[key] = make()
    return cache[key]


_SCORING: dict[str, tuple[Any, Stops, Scorer, Scorer]] = {}


def scoring_side(cfg: RunConfig) -> tuple[Any, Stops, Scorer, Scorer]:
    """(tokenizer, stops, train reward scorer, eval reward scorer) of a resolved run config, without loading its
    prompt data: what a process that only scores rollouts needs (rollout/finish.py). Cached per process by the
    config's hash."""
    key = cfg.config_hash()
    if key in _SOURCES:
        src = _SOURCES[key]
        return src.tokenizer, src.stops, src.scorer, src.eval_scorer

    def make() -> tuple[Any, Stops, Scorer, Scorer]:
        tok = tokenizer_at(_checkpoint(cfg))
        return (tok, _stops(cfg, tok), *_scorers(cfg))

    return cached(_SCORING, key, make)


def _checkpoint(cfg: RunConfig) -> str:
    if cfg.hf_checkpoint is None:
        raise ValueError("the config is not resolved: --hf-checkpoint is unset (flows.resolve fills it in)")
    return cfg.hf_checkpoint


def _stops(cfg: RunConfig, tok: Any) -> Stops:
    return resolve_stops(
        tok,
        cfg.hf_checkpoint,
        cfg.rollout.rollout_stop,
        cfg.rollout.rollout_stop_token_ids,
        cfg.data.apply_chat_template_kwargs,
    )


def _scorers(cfg: RunConfig) -> tuple[Scorer, Scorer]:
    """The train and eval reward scorers."""
    r = cfg.reward
    settings = vars(slime_args(cfg))  # slime's `args`: the whole config
    scorer = Scorer(r.rm_type, r.custom_rm_path, r.reward_key, settings, r.rm_timeout)
    eval_scorer = Scorer(
        r.rm_type, r.custom_rm_path, r.eval_reward_key or r.reward_key, settings, r.rm_timeout
    )
    return scorer, eval_scorer


def _source(cfg: RunConfig, tokenizer: Any) -> RolloutSource:
    checkpoint = _checkpoint(cfg)
    tok = tokenizer if tokenizer is not None else tokenizer_at(checkpoint)
    d, stops = cfg.data, _stops(cfg, tok)
    train = load_prompts(d.prompt_data, tok, train_keys(cfg)) if d.prompt_data else None
    evals = tuple(
        (name, load_prompts(path, tok, eval_keys(cfg), flag=f"--eval-prompt-data {name}"))
        for name, path in d.eval_datasets
    )
    scorer, eval_scorer = _scorers(cfg)
    return RolloutSource(tok, stops, train, evals, scorer, eval_scorer)


def train_params(cfg: RunConfig, stops: Stops) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        temperature=r.rollout_temperature,
        top_p=r.rollout_top_p,
        top_k=r.rollout_top_k,
        max_new_tokens=r.rollout_max_response_len,
        stop_token_ids=stops.ids,
    )


def eval_params(cfg: RunConfig, stops: Stops) -> SamplingParams:
    r, e = cfg.rollout, cfg.eval
    return SamplingParams(
        temperature=e.eval_temperature or r.rollout_temperature,
        top_p=e.eval_top_p if e.eval_top_p is not None else r.rollout_top_p,
        top_k=e.eval_top_k if e.eval_top_k is not None else r.rollout_top_k,
        max_new_tokens=e.eval_max_response_len or r.rollout_max_response_len,
        stop_token_ids=stops.ids,
    )
