"""Who may call the policy server, and how much they may send: API keys (`ARLOOP_POLICY_KEYS`,
as vLLM's `--api-key`), the eval gate's key alone for rejected versions, and a body limit
that answers 413 before anything reads or tokenises the body."""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import defaultdict, deque
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from deploy.credentials import PolicyKey
from deploy.policy_server.openai_wire import OpenAIError

bearer = HTTPBearer(
    auto_error=False,
    description="A key of ARLOOP_POLICY_KEYS (none needed when it is empty)",
)


async def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> PolicyKey | None:
    """The key the request carries (None when the server needs none); 401 otherwise."""
    keys: list[PolicyKey] = request.app.state.policy_keys
    if not keys:
        return None
    if credentials is None:
        raise OpenAIError(
            401,
            "this policy server needs an API key: send `Authorization: Bearer <key>` "
            "(ARLOOP_POLICY_API_KEY on arloop's processes)",
            code="invalid_api_key",
        )
    sent = credentials.credentials.encode()
    found = None
    for key in keys:  # every key compared, in constant time: no timing tells which is close
        if hmac.compare_digest(sent, key.key.get_secret_value().encode()):
            found = key
    if found is None:
        raise OpenAIError(
            401, "the API key is not one of ARLOOP_POLICY_KEYS", code="invalid_api_key"
        )
    return found


Caller = Annotated[PolicyKey | None, Depends(caller)]
"""A route's parameter: the caller's key (401 before the route runs without a valid one)."""


def may_sample_rejected(key: PolicyKey | None) -> bool:
    """Only the eval gate's key samples a rejected version (with no keys, nobody does)."""
    return key is not None and key.gate


def rejected_refusal(version: str) -> OpenAIError:
    return OpenAIError(
        403,
        f"version {version} was rejected by the eval gate; only the gate's key "
        '(`{"gate": true}` in ARLOOP_POLICY_KEYS) may sample it',
        param="model",
        code="model_rejected",
    )


class TokenBudget:
    """Completion tokens each key may ask for a minute (`n` x `max_tokens`, reserved when a
    request starts), a sliding window per key; without keys, all callers share one window."""

    def __init__(self, per_minute: int | None) -> None:
        self.per_minute = per_minute
        self._spent: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._lock = threading.Lock()

    def take(
        self, key: PolicyKey | None, tokens: int, now: float | None = None
    ) -> tuple[float, int] | None:
        """Reserve `tokens` for `key` (the reservation, for `give_back`), or a 429 saying when
        the window has room again."""
        if self.per_minute is None:
            return None
        now = time.monotonic() if now is None else now
        name = key.name if key is not None else ""
        with self._lock:
            window = self._spent[name]
            while window and window[0][0] <= now - 60:
                window.popleft()
            used = sum(n for _, n in window)
            if used + tokens > self.per_minute:
                error = OpenAIError(
                    429,
                    f"this key asked for {used} completion tokens in the last minute; "
                    f"{tokens} more is over ARLOOP_KEY_TOKENS_PER_MINUTE ({self.per_minute})",
                    code="rate_limit_exceeded",
                )
                error.retry_after = max(1, math.ceil(window[0][0] + 60 - now)) if window else 60
                raise error
            window.append((now, tokens))
        return window[-1]

    def give_back(self, key: PolicyKey | None, reservation: tuple[float, int] | None) -> None:
        """Cancel a reservation nothing was generated for (the request was refused with 503,
        or its client left while it waited)."""
        if reservation is None:
            return
        with self._lock:
            window = self._spent[key.name if key is not None else ""]
            if reservation in window:
                window.remove(reservation)
