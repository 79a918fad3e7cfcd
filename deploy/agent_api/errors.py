"""How failures become answers: `{"detail": reason}` with a status, never a bare 500 for bad input.

One handler answers every `ArloopError` (tokens, threads, feedback, rate limits, unknown agents,
the policy endpoint's 502/504); Redis being down is a 503 through the same answer. Bodies that
do not validate keep FastAPI's own 422.
"""

from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agents.errors import ArloopError

log = logging.getLogger(__name__)


class Unauthorized(ArloopError):
    """401 with the `WWW-Authenticate: Bearer` challenge."""

    def __init__(self, reason: str) -> None:
        super().__init__(401, reason)

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


def _answer(request: Request, exc: ArloopError) -> JSONResponse:
    """The response for an error, counted by status."""
    services = getattr(request.app.state, "services", None)
    if services is not None:
        services.metrics.errors.labels(str(exc.status)).inc()
    return JSONResponse({"detail": exc.reason}, status_code=exc.status, headers=exc.headers())


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ArloopError)
    async def arloop_error(request: Request, exc: ArloopError) -> JSONResponse:
        if exc.status >= 500:  # a fault on our side (the policy endpoint): the operator's to see
            log.warning("%d on %s: %s", exc.status, request.url.path, exc.reason)
        return _answer(request, exc)

    @app.exception_handler(redis.RedisError)
    async def redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        log.warning("redis failed: %s: %s", type(exc).__name__, exc)
        reason = f"Redis is unavailable ({type(exc).__name__}); retry shortly"
        return _answer(request, ArloopError(503, reason, retry_after=1))
