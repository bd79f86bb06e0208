"""Generated samples scored and packaged as rollout rows, the same way whether the run's own generation, a
`--custom-generate-function-path` or a `--rollout-function-path` produced them.

A reward runs once per sample, or with `--group-rm` once per prompt group (slime's group reward). A custom
group reward is called as `reward(args, samples)` and returns one reward per sample of the group. A built-in
one scores each sample as without the flag. A sample a generate function already scored (`reward` set) is not
scored again, as in slime.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

from engines.base import GenerateOutput
from rollout.rewards import RewardRequest, RewardTimeout, Scored, Scorer
from rollout.sample import Sample, label_text, to_row
from rollout.template import Stops, cut_at_stop_string

__all__ = ["finished_sample", "label_text", "package", "score_samples"]


def finished_sample(sample: Sample, out: GenerateOutput, tokenizer: Any, stops: Stops) -> tuple[Sample, str]:
    """`sample` (its prompt in `tokens`) completed with one engine output, and how it ended (stop, stop_string
    or length). The response is cut at the first stop string and decoded, with loss mask 1 on every token and
    the status from how it ended."""
    tokens, log_probs, reason = list(out.response_tokens), list(out.log_probs), out.finish_reason
    n = cut_at_stop_string(tokens, tokenizer, stops.strings)
    if n is not None and (n < len(tokens) or reason != "stop"):
        tokens, log_probs, reason = tokens[:n], log_probs[:n], "stop_string"
    sample.tokens = list(sample.tokens) + tokens
    sample.response = tokenizer.decode(tokens, skip_special_tokens=True)
    sample.response_length = len(tokens)
    sample.loss_mask = [1] * len(tokens)
    sample.rollout_log_probs = log_probs
    sample.weight_versions = [str(out.weight_version)]
    sample.status = Sample.Status.TRUNCATED if reason == "length" else Sample.Status.COMPLETED
    return sample, reason


def _request(s: Sample) -> RewardRequest:
    prompt = s.prompt if isinstance(s.prompt, str) else label_text(s.prompt)
    return RewardRequest(prompt, s.response, s.label, s.metadata, s.index or 0, sample=s)


async def score_samples(scorer: Scorer, samples: list[Sample], group_rm: bool = False) -> list[Scored]:
    """The reward of every sample, in order (see the module docstring); a sample whose reward is already set keeps
    it (a dict goes through `--reward-key` as a returned one does)."""
    out: list[Scored | None] = [None] * len(samples)
    todo = []
    for i, s in enumerate(samples):
        if s.reward is not None:
            out[i] = _given(scorer, s)
        else:
            todo.append(i)
    if group_rm and not scorer.builtin:
        groups: dict[int, list[int]] = {}
        for i in todo:
            groups.setdefault(samples[i].group_index or 0, []).append(i)
        calls = [_score_group(scorer, [samples[i] for i in g]) for g in groups.values()]
        if inspect.iscoroutinefunction(scorer.fn):
            done = await asyncio.gather(*calls)
        else:  # a sync reward sees its groups one after another, in order, as a per-sample one sees its samples
            done = [await c for c in calls]
        for g, scores in zip(groups.values(), done, strict=True):
            for i, sc in zip(g, scores, strict=True):
                out[i] = sc
    else:
        for i, sc in zip(todo, await scorer.score([_request(samples[i]) for i in todo]), strict=True):
            out[i] = sc
    return [sc for sc in out if sc is not None]


def _given(scorer: Scorer, s: Sample) -> Scored:
    try:
        return scorer._to_scored(s.reward, _request(s))
    except ValueError as e:
        raise ValueError(
            f"sample {s.index} came with reward {s.reward!r} from its generate function: {e}"
        ) from None


async def _score_group(scorer: Scorer, group: list[Sample]) -> list[Scored]:
    """One `reward(args, samples)` call for a group; its failure, or no answer within --rm-timeout, fails every
    sample of the group. A wrong number of rewards is a bug in the reward, and raises."""
    try:
        values = await _call_with_timeout(scorer.fn, (scorer.args, group), scorer.timeout)
    except RewardTimeout:
        e: Exception = RewardTimeout(
            f"group reward {scorer.name} did not return within {scorer.timeout:g} s (--rm-timeout) for group "
            f"{group[0].group_index}: call abandoned, its samples marked failed"
        )
        return [Scored(0.0, error=f"{type(e).__name__}: {e}")] * len(group)
    except Exception as e:
        return [Scored(0.0, error=f"{type(e).__name__}: {e}")] * len(group)
    if not isinstance(values, list | tuple) or len(values) != len(group):
        raise ValueError(
            f"--group-rm reward {scorer.name} returned {type(values).__name__} "
            f"{'of ' + str(len(values)) + ' ' if isinstance(values, list | tuple) else ''}for group "
            f"{group[0].group_index} of {len(group)} samples: expected a list of one reward per sample"
        )
    return [scorer._to_scored(v, _request(s)) for v, s in zip(values, group, strict=True)]


async def _call_with_timeout(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float | None) -> Any:
    """`fn(*args)`'s value, awaited if it is awaitable; RewardTimeout past `timeout` seconds. A function that is
    not a coroutine function runs on a daemon thread, abandoned when late (as rollout.rewards does for a
    per-sample reward); a coroutine it returns is awaited here, within what is left of the time."""
    if timeout is None:
        value = fn(*args)
        return await value if inspect.isawaitable(value) else value
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        if inspect.iscoroutinefunction(fn):
            return await asyncio.wait_for(fn(*args), timeout)
        future: asyncio.Future[Any] = loop.create_future()

        def settle(ok: bool, result: Any) -> None:
            if not future.done():
                future.set_result(result) if ok else future.set_exception(result)

        def run() -> None:
            try:
                ok, result = True, fn(*args)
            except Exception as e:  # handed to the waiting coroutine, which raises it
                ok, result = False, e
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, ok, result)

        threading.Thread(target=run, name="rollflow-group-reward", daemon=True).start()
        value = await asyncio.wait_for(future, timeout)
        if inspect.isawaitable(value):
            value = await asyncio.wait_for(value, max(0.0, deadline - loop.time()))
        return value
    except TimeoutError:
        raise RewardTimeout() from None


def package(
    samples: list[Sample],
    scored: list[Scored],
    rollout_id: int,
    extra: list[dict[str, Any]],
    weight_version: int | None = None,
) -> list[Any]:
    """The rollout rows of scored `samples`.
    - The reward's side entries go under `metadata["reward_extra"]`.
    - A failed reward gives status `failed`, its error under `metadata["reward_error"]`, loss mask zeroed.
    - `extra[i]` is added to sample i's metadata (where it came from).
    The weight version is `weight_version`, else the engine's: all of a rollout's outputs come from one,
    checked before."""
    rows = []
    for s, sc, more in zip(samples, scored, extra, strict=True):
        s.metadata = {**s.metadata, **more}
        if sc.extra:
            s.metadata["reward_extra"] = sc.extra
        if sc.error is not None:
            s.status, s.metadata["reward_error"] = Sample.Status.FAILED, sc.error
        if weight_version is not None:
            version = weight_version
        else:
            version = int(s.weight_versions[-1]) if s.weight_versions else 0
        rows.append(to_row(s, rollout_id, version, sc.reward))
    return rows
