"""How a plug-in generates: a small async client of the run's engines, in place of the SGLang router a slime
plug-in POSTs to.

Inside a `--custom-generate-function-path` or `--rollout-function-path` function:

    from rollout.engine_client import generate

    output = await generate(args, {"input_ids": sample.tokens, "sampling_params": sampling_params})
    sample.append_response_tokens(
        args,
        tokens=[t for _, t, _ in output["meta_info"]["output_token_logprobs"]],
        log_probs=[lp for lp, _, _ in output["meta_info"]["output_token_logprobs"]],
        meta_info=output["meta_info"],
        text=output["text"],
    )

`generate(args, payload)` takes SGLang's /generate payload (`input_ids` or `text`, `sampling_params`) and answers
in SGLang's shape (`text`, `output_ids`, `meta_info` with `output_token_logprobs` as [log_prob, token_id, None]
triples, `finish_reason` {"type": "stop" | "length"}, `weight_version`, `prompt_tokens`, `completion_tokens`).
A stop string (`sampling_params["stop"]`) ends the output with the text that matched it, as slime's
`no_stop_trim=True`; the run's own stop tokens and strings always apply. The output is cut to fit the model's
context.

Every call is made on the weights the rollout names (an engine holding another version refuses), from the
rollout actor, on the engine of the sample's prompt group. Calls made at the same time go to the engine as one
batch. Seeds: the n-th call made for a sample is seeded from the sample's seed and n, unless the payload gives
`sampling_params["sampling_seed"]`. So a replay generates the same tokens. The first call uses the sample's
seed itself, so a plug-in that generates once samples what rollflow's own generation samples. A sync rollout
function runs on a worker thread and waits for a coroutine with `run(coro)`.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engines.base import GenerateOutput, GenerateRequest, SamplingParams
from rollout.template import Stops, cut_at_stop_string

_T = TypeVar("_T")

# SGLang sampling parameters with nothing to do here: they describe how SGLang formats its answer, which
# this client answers the one way slime sets them (no_stop_trim=True, spaces_between_special_tokens=False)
_FORMATTING = frozenset({"no_stop_trim", "spaces_between_special_tokens", "custom_params"})
_KNOWN = (
    frozenset(
        {
            "temperature",
            "top_p",
            "top_k",
            "max_new_tokens",
            "stop",
            "stop_token_ids",
            "skip_special_tokens",
            "sampling_seed",
        }
    )
    | _FORMATTING
)


class EngineClientError(RuntimeError):
    """A plug-in's engine call that cannot be made as asked; the message names what to change."""


@dataclass
class _Caller:
    """The sample on whose behalf calls are made (set per sample by rollout.plugins)."""

    seed: int
    engine: int
    calls: int = 0


_CLIENT: contextvars.ContextVar[EngineClient | None] = contextvars.ContextVar(
    "rollflow_engine_client", default=None
)
_CALLER: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar(
    "rollflow_engine_caller", default=None
)


def call_seed(seed: int, n: int) -> int:
    """The seed of the n-th engine call made for a sample seeded `seed` (the sample's own for the first)."""
    if n == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:call:{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass
class EngineClient:
    """The run's engines (Ray actor handles of engines.actor.EngineActor) on weight `version`, with the
    tokenizer, the run's stops and the model's context length (`max_len` tokens)."""

    engines: list[Any]
    version: int
    ctx: dict[str, Any]
    tokenizer: Any
    stops: Stops
    max_len: int | None = None
    seconds: dict[int, float] = field(default_factory=dict)  # engine -> time it spent generating for us
    loop: asyncio.AbstractEventLoop | None = None
    plugin_context: Any = None  # what rollout.plugins keeps for the rollout's duration
    _pending: dict[int, list[tuple[GenerateRequest, asyncio.Future[GenerateOutput]]]] = field(
        default_factory=dict
    )
    _sending: set[asyncio.Task[None]] = field(default_factory=set)

    def __enter__(self) -> EngineClient:
        self.loop = asyncio.get_running_loop()
        self._token = _CLIENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CLIENT.reset(self._token)

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One completion of SGLang's /generate `payload`, in SGLang's answer shape (see the module docstring)."""
        if not isinstance(payload, dict):
            raise EngineClientError(f"generate takes SGLang's payload dict, got {type(payload).__name__}")
        params = dict(payload.get("sampling_params") or {})
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise EngineClientError(
                f"sampling_params {unknown}: not supported by rollflow's engines (supported: {sorted(_KNOWN)})"
            )
        ids = self._input_ids(payload)
        caller = _CALLER.get()
        if "sampling_seed" in params:
            seed, engine = int(params["sampling_seed"]), caller.engine if caller else 0
        elif caller is not None:
            seed, engine = call_seed(caller.seed, caller.calls), caller.engine
            caller.calls += 1
        else:
            raise EngineClientError(
                "generate called outside a sample's generate call: give sampling_params['sampling_seed'], or "
                "generate through rollout.plugins.generate_and_rm(args, sample, sampling_params)"
            )
        request = self._request(ids, params, seed)
        if request.params.max_new_tokens <= 0:  # no room left in the context
            return self._answer(ids, GenerateOutput((), (), "length", self.version), params)
        out = await self._submit(engine % len(self.engines), request)
        return self._answer(ids, out, params)

    def _input_ids(self, payload: dict[str, Any]) -> list[int]:
        if payload.get("input_ids") is not None:
            ids = [int(t) for t in payload["input_ids"]]
        elif isinstance(payload.get("text"), str):
            ids = list(self.tokenizer.encode(payload["text"], add_special_tokens=False))
        else:
            raise EngineClientError("the payload needs input_ids (a list of token ids) or text")
        if not ids:
            raise EngineClientError("the payload's prompt is empty")
        return ids

    def _request(self, ids: list[int], params: dict[str, Any], seed: int) -> GenerateRequest:
        stop_ids = set(self.stops.ids) | {int(t) for t in params.get("stop_token_ids") or []}
        for s in self._stop_strings(params):
            one = self.tokenizer.encode(s, add_special_tokens=False)
            if len(one) == 1:  # a one-token stop string is a stop token: the engine stops there
                stop_ids.add(int(one[0]))
        wanted = params.get("max_new_tokens")
        if wanted is None:
            raise EngineClientError("sampling_params needs max_new_tokens")
        room = int(wanted) if self.max_len is None else min(int(wanted), self.max_len - len(ids))
        return GenerateRequest(
            tuple(ids),
            seed,
            SamplingParams(
                temperature=float(params.get("temperature", 1.0)),
                top_p=float(params.get("top_p", 1.0)),
                top_k=int(params.get("top_k", -1)),
                max_new_tokens=room,
                stop_token_ids=tuple(sorted(stop_ids)),
            ),
        )

    def _stop_strings(self, params: dict[str, Any]) -> tuple[str, ...]:
        given = params.get("stop") or []
        return tuple(dict.fromkeys([*self.stops.strings, *([given] if isinstance(given, str) else given)]))

    def _answer(self, ids: list[int], out: GenerateOutput, params: dict[str, Any]) -> dict[str, Any]:
        tokens, lps, reason = list(out.response_tokens), list(out.log_probs), out.finish_reason
        n = cut_at_stop_string(tokens, self.tokenizer, self._stop_strings(params))
        if n is not None:
            tokens, lps, reason = tokens[:n], lps[:n], "stop"
        text = self.tokenizer.decode(
            tokens, skip_special_tokens=bool(params.get("skip_special_tokens", True))
        )
        return {
            "text": text,
            "output_ids": tokens,
            "meta_info": {
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, tokens, strict=True)],
                "finish_reason": {"type": "length" if reason == "length" else "stop"},
                "weight_version": out.weight_version,
                "prompt_tokens": len(ids),
                "completion_tokens": len(tokens),
            },
        }

    async def _submit(self, engine: int, request: GenerateRequest) -> GenerateOutput:
        """`request`'s output; requests submitted in the same event-loop turn go to the engine as one batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateOutput] = loop.create_future()
        batch = self._pending.setdefault(engine, [])
        batch.append((request, future))
        if len(batch) == 1:
            loop.call_soon(self._flush, engine)
        return await future

    def _flush(self, engine: int) -> None:
        batch = self._pending.pop(engine)
        task = asyncio.ensure_future(self._send(engine, batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self, engine: int, batch: list[tuple[GenerateRequest, asyncio.Future[GenerateOutput]]]
    ) -> None:
        try:
            answer = await self.engines[engine].generate.remote([r for r, _ in batch], self.version, self.ctx)
        except BaseException as e:  # every caller of the batch sees the engine's error
            for _, f in batch:
                if not f.done():
                    f.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        self.seconds[engine] = self.seconds.get(engine, 0.0) + answer.seconds
        for (_, f), out in zip(batch, answer.outputs, strict=True):
            if not f.done():
                f.set_result(out)


def current_client() -> EngineClient:
    """The client of the rollout being generated; an error outside a plug-in call."""
    client = _CLIENT.get()
    if client is None:
        raise EngineClientError(
            "no engine to generate with: rollout.engine_client works inside a --custom-generate-function-path "
            "or --rollout-function-path call made by rollflow"
        )
    return client


async def generate(args: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """One completion of SGLang's /generate `payload` on the run's engines (see the module docstring); `args` is
    slime's args (unused: kept so a call reads as a slime plug-in's `post(url, payload)`)."""
    return await current_client().generate(payload)


def tokenizer(args: Any) -> Any:
    """The run's tokenizer (slime's plug-ins load it from `args.hf_checkpoint`; this is the same one, loaded)."""
    return current_client().tokenizer


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Wait for `coro` from a sync rollout function (which runs on a worker thread): slime's `run`."""
    loop = current_client().loop
    assert loop is not None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise EngineClientError(
            "run() waits from a sync function's thread; in async code, await the coroutine"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def for_sample(seed: int, engine: int) -> contextvars.Token[_Caller | None]:
    """Make the calls of the current task (until reset) on behalf of a sample seeded `seed` on `engine`."""
    return _CALLER.set(_Caller(seed, engine))


def reset_sample(token: contextvars.Token[_Caller | None]) -> None:
    _CALLER.reset(token)
