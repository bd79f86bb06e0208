"""Rewards: built-in rules chosen with `--rm-type`, or the user's function named by `--custom-rm-path`.

A reward sees one sample: its prompt (the rendered text), its response (decoded), its label (as the data
row gave it) and its metadata (the row's --metadata-key object plus what rollflow adds). It returns a
number, or a dict whose `--reward-key` entry is the number. Two calling conventions are accepted for a
custom function, so that a slime reward module works unchanged:

- keywords: `def rm(prompt, response, label, metadata)` (any subset, or `**kwargs`);
- slime's: `async def rm(args, sample)` with slime's `Sample` (rollout/sample.py) and the run's whole `args`
  (rollout/slime_args.py); a `(*args, **kwargs)` wrapper is called this way too. With `--group-rm`,
  `rm(args, samples)` once per group (rollout/scoring.py).

The built-in rules mean what slime's `--rm-type` rules mean, score for score (rollout/rm_hub/): math,
deepscaler, dapo, f1, gpqa, remote_rm (with --rm-url), random. Each also has a `boxed_` prefix that scores
the last `\\boxed{...}` of the response. rollflow adds its own exact_match, tiny-arith and long-arith.

Sync and async functions both work. Rewards run in the run's rollout actor, never inside an engine.
A reward that raises marks its sample `failed`: reward 0, excluded from the loss, the exception text in
its metadata. A rollout fails only if every sample failed. A custom reward that does not return within
`--rm-timeout` seconds for a sample fails that sample the same way, with a warning that names it. A reward
that returns something that is not a finite number is a bug in the reward, and the error names the sample.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import inspect
import logging
import math
import threading
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout.extensions import load_function
from rollout.sample import reward_sample

BOXED = "boxed_"
REMOTE = "remote_rm"


# -- built-in rules --------------------------------------------------------------------------------------
def exact_match(response: str, label: Any) -> float:
    """1.0 iff the response equals the label after stripping surrounding whitespace."""
    return 1.0 if response.strip() == str(label).strip() else 0.0


def random_reward(response: str, label: Any, prompt: str, sample_index: int) -> float:
    """slime's `random`: 0 or 1 with equal odds, drawn here from a hash of the sample so that a replay of the
    same rollout scores it the same."""
    digest = hashlib.sha256(f"{prompt}\0{response}\0{label}\0{sample_index}".encode()).digest()
    return float(digest[0] & 1)


# name -> the rule, or "module:attr" for a rule imported when named (sympy is slow to import)
BUILTIN_REWARDS: dict[str, Callable[..., Any] | str] = {
    "exact_match": exact_match,
    "math": "rollout.rm_hub.mathd:math_reward",
    "deepscaler": "rollout.rm_hub.mathd:deepscaler_reward",
    "dapo": "rollout.rm_hub.dapo:dapo_reward",
    "f1": "rollout.rm_hub.qa:f1_reward",
    "gpqa": "rollout.rm_hub.qa:gpqa_reward",
    "random": random_reward,
    REMOTE: "rollout.rm_hub.remote:remote_reward",
    "tiny-arith": "recipes.tiny_arith.reward:reward",
    "long-arith": "recipes.long_arith.reward:reward",
}
# what a rule takes of the sample besides (response, label)
_RULE_EXTRAS: dict[str, tuple[str, ...]] = {"gpqa": ("metadata",), "random": ("prompt", "sample_index")}
# slime rules rollflow does not run, and what to do instead
_NOT_BUILTIN = {
    "ifbench": "slime's ifbench clones github.com/allenai/IFBench and pip-installs its requirements when first "
    "imported, which rollflow does not do at run time: install IFBench yourself and give --custom-rm-path a "
    "function (args, sample) that scores with its evaluation_lib",
}


# built-in rules whose label must be text: they call str methods on it; the others compare with str(label), so a
# number works too (any other type scores 0 for every sample, or fails it)
TEXT_LABELS = frozenset({"tiny-arith", "long-arith", "f1"})
# rules that take the label as the row gives it (metadata, or the server, reads it)
ANY_LABEL = frozenset({"gpqa", "random", REMOTE})


def label_problem(rm_type: str, label: Any) -> str | None:
    """Why the built-in reward `rm_type` cannot score against `label` (a bool, a list, a dict, null, or a number
    where it needs text; for dapo, no integer); None when it can, or when `rm_type` is not a built-in."""
    name = rm_type.removeprefix(BOXED)
    if name not in BUILTIN_REWARDS or name in ANY_LABEL:
        return None
    wanted: tuple[type, ...] = (str,) if name in TEXT_LABELS else (str, int, float)
    if not isinstance(label, wanted) or isinstance(label, bool):
        names = "a string" if name in TEXT_LABELS else "a string or a number"
        return f"--rm-type {rm_type} expects {names} as the label, got {type(label).__name__} {str(label)[:60]!r}"
    if name == "dapo":
        from rollout.rm_hub.dapo import integer_label

        try:
            integer_label(label)
        except ValueError as e:
            return f"--rm-type {rm_type}: {e}"
    return None


def sample_rule(metadata: Any, rm_type: str) -> str:
    """The built-in rule that scores a sample: its metadata's `rm_type` when it names one (slime's per-sample
    choice, e.g. a dataset of a multi-task eval), else `rm_type` (--rm-type)."""
    own = metadata.get("rm_type") if isinstance(metadata, dict) else None
    return own.strip() if isinstance(own, str) and own.strip() else rm_type


def builtin_reward(rm_type: str) -> Callable[..., Any]:
    """The rule called `rm_type` (a `boxed_` prefix first extracts the last \\boxed{...} of the response, as
    slime does). It takes (response, label) and, for gpqa and random, the sample fields in `_RULE_EXTRAS`."""
    name = rm_type.removeprefix(BOXED)
    if name in _NOT_BUILTIN:
        raise ValueError(f"--rm-type {rm_type}: {_NOT_BUILTIN[name]}")
    if name not in BUILTIN_REWARDS:
        raise ValueError(
            f"--rm-type {rm_type!r}: unknown; built-ins are {sorted(BUILTIN_REWARDS)} "
            f"(each also as {BOXED}<name>), or give --custom-rm-path module.fn"
        )
    rule = BUILTIN_REWARDS[name]
    if isinstance(rule, str):
        module, _, attr = rule.partition(":")
        rule = getattr(importlib.import_module(module), attr)
    if rm_type.startswith(BOXED) and name != REMOTE:  # slime posts the whole response to a remote_rm
        from rollout.rm_hub.mathd import boxed_answer

        inner = rule
        return lambda response, label, *extras: inner(boxed_answer(response) or "", label, *extras)
    return rule


def probe_response(rm_type: str | None, label: Any) -> str:
    """A response that answers `label` the way the rule `rm_type` reads an answer. `rollflow run --dry-run`
    scores it on a few rows, so a rule that raises or returns no number is found before anything starts."""
    name = (rm_type or "").removeprefix(BOXED)
    text = "" if label is None else str(label)
    if rm_type and rm_type.startswith(BOXED) or name == "math":
        return f"The answer is \\boxed{{{text}}}."
    if name == "deepscaler":
        return f"<think>Work it out.</think> The answer is \\boxed{{{text}}}."
    if name == "dapo":
        return f"Work it out.\nAnswer: {text}"
    if name == "gpqa":
        return f"The answer is {text}"
    return text


# -- scoring -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scored:
    """The reward of one sample, or why it could not be computed (`error`, then `reward` is 0)."""

    reward: float
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the other entries of a dict-valued reward


@dataclass(frozen=True)
class RewardRequest:
    """What a reward sees of one sample."""

    prompt: str
    response: str
    label: Any
    metadata: dict[str, Any]
    sample_index: int
    # the slime-shaped sample (rollout.sample.Sample) handed to an (args, sample) reward; None = made from the above
    sample: Any = None


class Scorer:
    """One reward function with its calling convention resolved; `score` runs it over many samples."""

    def __init__(
        self,
        rm_type: str | None,
        custom_rm_path: str | None,
        reward_key: str | None,
        settings: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        if custom_rm_path:
            self.name, self.fn = custom_rm_path, load_function(custom_rm_path, "--custom-rm-path")
        elif rm_type:
            self.name, self.fn = rm_type, builtin_reward(rm_type)
        else:
            raise ValueError(
                "no reward: give --rm-type (built-ins: "
                f"{sorted(BUILTIN_REWARDS)}) or --custom-rm-path module.fn"
            )
        self.builtin = not custom_rm_path
        self.reward_key = reward_key
        # slime's `args`, for slime-style functions: `settings` is the run's whole config (rollout.slime_args)
        self.args = Namespace(
            **{
                **(settings or {}),
                "rm_type": rm_type,
                "custom_rm_path": custom_rm_path,
                "reward_key": reward_key,
            }
        )
        self._style = "builtin" if self.builtin else _calling_style(self.fn, custom_rm_path or "")
        self._builtin_setup(rm_type or "", timeout)
        # the built-in rules are ours and never wait on anything: they run inline, at no cost (remote_rm
        # bounds its own requests)
        self.timeout = None if self.builtin else timeout
        self._in_thread = self.timeout is not None and not inspect.iscoroutinefunction(self.fn)

    async def score(self, requests: list[RewardRequest]) -> list[Scored]:
        """Rewards in request order; async functions run concurrently. A plain function's values are taken as
        it returns them: only awaitables get a task each, since a task per sample costs more than the scoring.
        With a timeout, a call that has not returned after `timeout` seconds fails its sample (`RewardTimeout`)
        and is abandoned, with a warning naming the reward and the sample. The other samples score as they
        would without it."""
        if self.builtin:
            return await self._builtin_scores(requests)
        if self._in_thread:
            values = await self._in_order(requests)
        else:
            values = [self._guarded(r) for r in requests]
        return await self._scored(requests, values)

    def remote_bounded(self, seconds: float) -> Scorer:
        """This reward with its remote_rm calls bounded by `seconds` each, retries included, where no --rm-timeout
        bounds them (a copy: the dry run's probe, which must not wait out slime's 10 attempts)."""
        if self._remote_timeout is not None:
            return self
        out = copy.copy(self)
        out._remote_timeout = seconds
        return out

    def _builtin_setup(self, rm_type: str, timeout: float | None) -> None:
        """What a built-in rule needs besides (response, label), checked before anything runs: remote_rm its
        --rm-url, dapo (whose value is a dict) its --reward-key."""
        name = rm_type.removeprefix(BOXED)
        self._rules: dict[str, Callable[..., Any]] = {rm_type: self.fn} if self.builtin else {}
        self._url: str | None = getattr(self.args, "rm_url", None)
        self._remote_timeout = timeout
        if not self.builtin:
            return
        if name == REMOTE and not self._url:
            raise ValueError(f"--rm-type {rm_type} posts each sample to a reward server: give --rm-url URL")
        if name == "dapo" and self.reward_key is None:
            raise ValueError(
                f"--rm-type {rm_type} returns a dict {{score, acc, pred}}, as slime's: give --reward-key score"
            )

    async def _builtin_scores(self, requests: list[RewardRequest]) -> list[Scored]:
        """Each sample scored by its rule: the one its metadata's `rm_type` names, as slime lets a sample (a
        multi-task eval's dataset) choose, else --rm-type; remote_rm samples share one connection pool."""
        names = [self._rule_name(r) for r in requests]
        if all(n.removeprefix(BOXED) != REMOTE for n in names):
            return await self._scored(requests, [self._guarded(r) for r in requests])
        from rollout.rm_hub import remote

        async with remote.client() as http:  # the posts are awaited inside: the pool closes after them
            values = [
                self._post(http, r) if n.removeprefix(BOXED) == REMOTE else self._guarded(r)
                for r, n in zip(requests, names, strict=True)
            ]
            return await self._scored(requests, values)

    def _rule_name(self, r: RewardRequest) -> str:
        return sample_rule(r.metadata, self.name)

    def _rule(self, name: str) -> Callable[..., Any]:
        if name not in self._rules:
            self._rules[name] = builtin_reward(name)
        return self._rules[name]

    def _post(self, http: Any, r: RewardRequest) -> Any:
        """slime's remote_rm call for `r` (awaitable), or its failure without --rm-url."""
        if not self._url:
            return _failed(
                ValueError(f"sample {r.sample_index} asks for rm_type remote_rm: give --rm-url URL")
            )
        from rollout.rm_hub.remote import remote_reward

        return remote_reward(http, self._url, _payload(r), self._remote_timeout)

    async def _scored(self, requests: list[RewardRequest], values: list[Any]) -> list[Scored]:
        """The scores of a reward's `values` for `requests` (values, awaitables or failures, in order)."""
        waiting = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
        if waiting:
            done = await asyncio.gather(*[self._awaited(values[i], requests[i]) for i in waiting])
            for i, value in zip(waiting, done, strict=True):
                values[i] = value
        return [
            v if isinstance(v, Scored) else self._to_scored(v, r)
            for v, r in zip(values, requests, strict=True)
        ]

    async def _in_order(self, requests: list[RewardRequest]) -> list[Any]:
        """The sync reward's values for `requests`, called one after another on a worker thread (as inline, so
        a stateful reward sees the same calls in the same order). A call past the timeout fails its sample, and
        a fresh worker goes on with the next sample.

        Why a thread: Python cannot kill one, but a hung reward almost always waits (a judge that never
        answers, a lock, a sleep) and so holds no GIL. The abandoned daemon thread blocks neither this actor's
        next calls nor its exit. A process per reward (verl's PRIME manager) would also stop a reward stuck in
        C code that holds the GIL. But it costs a spawn per restart, the pickling of every sample, and the
        module-level state (clients, caches) a reward keeps between calls. The stage timeout
        (`--rollout-timeout`) still bounds that rare case. `--rm-timeout none` calls the reward inline on the
        actor's main thread (for a reward that sets signal.alarm itself)."""
        assert self.timeout is not None
        loop, start = asyncio.get_running_loop(), 0
        values: list[Any] = [None] * len(requests)
        while start < len(requests):
            worker = _Worker(self._guarded, requests, start, loop)
            stuck = None
            while stuck is None and not worker.done.done():
                since = worker.running[1]
                await asyncio.wait([worker.done], timeout=max(0.0, since + self.timeout - time.monotonic()))
                stuck = worker.abandon_if_past(self.timeout)
            for i, value in worker.values.items():
                values[i] = value
            if stuck is None:
                break
            values[stuck], start = self._timed_out(requests[stuck]), stuck + 1
        return values

    def _timed_out(self, r: RewardRequest) -> Scored:
        """The failed score of a sample whose reward call was abandoned, said as a warning."""
        text = (
            f"reward {self.name} did not return within {self.timeout:g} s (--rm-timeout) for sample "
            f"{r.sample_index}: call abandoned, sample marked failed"
        )
        logging.getLogger(__name__).warning(text)
        return _failed(RewardTimeout(text))

    def _guarded(self, r: RewardRequest) -> Any:
        """The reward's value (or awaitable) for `r`; its own failure marks the sample failed, the rollout goes on."""
        try:
            return self._call(r)
        except Exception as e:
            return _failed(e)

    async def _awaited(self, value: Any, r: RewardRequest) -> Any:
        """An async reward's value; its failure, or no answer within the timeout (the call is then cancelled),
        marks the sample failed, as in `_guarded`. A call that blocks the event loop cannot be timed out here:
        the stage timeout bounds it."""
        call = asyncio.ensure_future(value)
        done, _ = await asyncio.wait([call], timeout=self.timeout)
        if not done:
            call.cancel()
            return self._timed_out(r)
        try:
            return call.result()
        except Exception as e:
            return _failed(e)

    def _call(self, r: RewardRequest) -> Any:
        if self._style == "builtin":
            name = self._rule_name(r)
            extras = (getattr(r, k) for k in _RULE_EXTRAS.get(name.removeprefix(BOXED), ()))
            return self._rule(name)(r.response, r.label, *extras)
        if self._style == "slime":
            return self.fn(self.args, reward_sample(r))
        given = {"prompt": r.prompt, "response": r.response, "label": r.label, "metadata": r.metadata}
        return self.fn(**{k: v for k, v in given.items() if self._style == "kwargs" or k in self._style})

    def _to_scored(self, value: Any, r: RewardRequest) -> Scored:
        extra: dict[str, Any] = {}
        if isinstance(value, dict):
            if self.reward_key is None:
                raise ValueError(
                    f"reward {self.name} returned a dict for sample {r.sample_index} "
                    f"(keys {sorted(value)}): name the scalar with --reward-key"
                )
            if self.reward_key not in value:
                raise ValueError(
                    f"reward {self.name} returned a dict without --reward-key {self.reward_key!r} for "
                    f"sample {r.sample_index} (keys {sorted(value)})"
                )
            extra = {k: v for k, v in value.items() if k != self.reward_key}
            value = value[self.reward_key]
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardValueError(
                f"reward {self.name} returned {value!r} ({type(value).__name__}) for sample "
                f"{r.sample_index} (prompt {r.prompt[:60]!r}): expected a finite number",
                returned=f"{value!r}"[:80] + f" ({type(value).__name__})",
            )
        return Scored(float(value), extra=_jsonable(extra))


class RewardValueError(ValueError):
    """A reward that returned something other than a finite number; `returned` says what, briefly."""

    def __init__(self, message: str, returned: str) -> None:
        super().__init__(message)
        self.returned = returned


class RewardTimeout(TimeoutError):
    """A reward call that did not return within `--rm-timeout` seconds (its sample is marked failed)."""


class _Worker:
    """Calls `call(requests[i])` for i = start, start + 1, ... one after another on a daemon thread of its own,
    keeping each value in `values`; `done` resolves (on `loop`) once every call returned. Once abandoned, it
    keeps nothing more and makes no further call."""

    def __init__(
        self,
        call: Callable[[RewardRequest], Any],
        requests: list[RewardRequest],
        start: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.values: dict[int, Any] = {}
        self.running = (start, time.monotonic())  # the call in progress and since when
        self.done: asyncio.Future[None] = loop.create_future()
        self._lock, self._abandoned, self._loop = threading.Lock(), False, loop
        thread = threading.Thread(
            target=self._run, args=(call, requests, start), name="rollflow-reward", daemon=True
        )
        thread.start()

    def _run(self, call: Callable[[RewardRequest], Any], requests: list[RewardRequest], start: int) -> None:
        for i in range(start, len(requests)):
            with self._lock:
                if self._abandoned:
                    return
                self.running = (i, time.monotonic())
            value = call(requests[i])
            with self._lock:
                if self._abandoned:
                    return
                self.values[i] = value
        try:
            self._loop.call_soon_threadsafe(_resolve, self.done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass  # the values are in self.values for a caller that still looks

    def abandon_if_past(self, timeout: float) -> int | None:
        """The index of the call running for `timeout` seconds or more, which this worker then abandons; None
        while none is (or once all returned)."""
        with self._lock:
            i, since = self.running
            if i in self.values or time.monotonic() - since < timeout:
                return None
            self._abandoned = True
            return i


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _payload(r: RewardRequest) -> dict[str, Any]:
    """What slime's remote_rm posts for a sample."""
    return {"prompt": r.prompt, "response": r.response, "label": r.label}


def _failed(e: Exception) -> Scored:
    """A sample whose reward raised `e`: reward 0, the error kept in its metadata."""
    return Scored(0.0, error=f"{type(e).__name__}: {e}")


def _calling_style(fn: Callable[..., Any], path: str) -> Any:
    """ "kwargs" (accepts **kwargs), a frozenset of the keyword names it takes, or "slime" (args, sample)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "kwargs"
    names = set(params)
    known = {"prompt", "response", "label", "metadata"}
    if names & known:
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return "kwargs"
        return frozenset(names & known)
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    # (*args, **kwargs): a wrapper without functools.wraps, called as slime calls every reward
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return "slime"
    raise ValueError(
        f"--custom-rm-path {path}: cannot call {getattr(fn, '__name__', fn)}{inspect.signature(fn)}: "
        "take keyword arguments (prompt, response, label, metadata) or slime's (args, sample)"
    )


def _jsonable(extra: dict[str, Any]) -> dict[str, Any]:
    """The side entries of a dict reward that can go into the sample's JSON metadata."""
    import json

    out = {}
    for k, v in extra.items():
        try:
            json.dumps(v, allow_nan=False)
            out[str(k)] = v
        except (TypeError, ValueError):
            out[str(k)] = repr(v)
    return out
