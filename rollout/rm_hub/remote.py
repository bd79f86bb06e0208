"""slime's `--rm-type remote_rm`: each sample is POSTed as JSON `{"prompt", "response", "label"}` to `--rm-url`
and the reward is the JSON the server answers (a number, or a dict read with `--reward-key`).

As slime does, each attempt may take up to 120 s and a failed one is retried with exponential backoff (1, 2, 4,
... s, at most 30, plus up to 1 s of jitter), up to 10 attempts. An explicit `--rm-timeout` also bounds the whole
call, retries included, after which the sample fails with the last error. A 4xx answer other than 408/429 is not
retried: the same request gets the same answer."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx

MAX_ATTEMPTS = 10
ATTEMPT_SECONDS = 120.0  # slime's aiohttp session's total timeout, per request
_RETRIED_STATUS = frozenset({408, 429})


class RemoteRewardError(RuntimeError):
    """The reward server gave no usable answer for a sample."""


def client() -> httpx.AsyncClient:
    """One connection pool for a batch of samples (64 connections, as slime's)."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=None)


async def remote_reward(
    http: httpx.AsyncClient, url: str, payload: dict[str, Any], timeout: float | None
) -> Any:
    """The server's JSON answer for `payload`; RemoteRewardError naming the URL, the attempts and the last
    error once the retries or `timeout` seconds are spent."""
    began = time.monotonic()
    deadline = None if timeout is None else began + timeout
    for attempt in range(1, MAX_ATTEMPTS + 1):
        left = ATTEMPT_SECONDS if deadline is None else min(ATTEMPT_SECONDS, deadline - time.monotonic())
        try:  # httpx bounds each phase (connect, read, ...) by `left`, wait_for the whole request
            answer = await asyncio.wait_for(http.post(url, json=payload, timeout=left), left)
        except (httpx.TimeoutException, TimeoutError):
            error = "no answer before the timeout"
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
        else:
            if answer.is_success:
                return _json(answer, url)
            error = f"HTTP {answer.status_code} {answer.reason_phrase}: {answer.text[:200]!r}"
            if answer.status_code < 500 and answer.status_code not in _RETRIED_STATUS:
                break
        wait = backoff(attempt)
        if attempt == MAX_ATTEMPTS or (deadline is not None and time.monotonic() + wait >= deadline):
            break
        await asyncio.sleep(wait)
    spent = time.monotonic() - began
    bound = "" if timeout is None else f", bounded to {timeout:g} s"
    raise RemoteRewardError(f"remote_rm POST {url}: {error} (attempt {attempt}, {spent:.1f} s{bound})")


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based), as slime waits."""
    return min(2 ** (attempt - 1), 30) + random.random()


def _json(answer: httpx.Response, url: str) -> Any:
    try:
        return answer.json()
    except json.JSONDecodeError:
        raise RemoteRewardError(
            f"remote_rm POST {url}: the answer is not JSON: {answer.text[:200]!r}"
        ) from None
