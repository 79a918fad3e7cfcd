"""How failures become answers: each a status and a reason, never a bare 500 for bad input."""

from __future__ import annotations

import logging

import redis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agents.feedback_intake import FeedbackRejected
from agents.policy_client import PolicyError
from agents.runtime import UnknownAgent
from agents.threads import ThreadError
from deploy.agent_api.limits import RateLimited

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An answer decided by a route or dependency."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers


def _answer(request: Request, status: int, reason: str, headers=None) -> JSONResponse:
    services = getattr(request.app.state, "services", None)
    if services is not None:
        services.metrics.errors.labels(str(status)).inc()
    return JSONResponse({"detail": reason}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _answer(request, exc.status, exc.reason, exc.headers)

    @app.exception_handler(ThreadError)
    @app.exception_handler(PolicyError)
    async def upstream_or_thread(request: Request, exc: ThreadError | PolicyError):
        return _answer(request, exc.status, exc.reason)

    @app.exception_handler(FeedbackRejected)
    async def feedback_rejected(request: Request, exc: FeedbackRejected) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return _answer(request, exc.status, exc.reason, headers)

    @app.exception_handler(RateLimited)
    async def rate_limited(request: Request, exc: RateLimited) -> JSONResponse:
        return _answer(request, 429, exc.reason, {"Retry-After": str(exc.retry_after)})

    @app.exception_handler(UnknownAgent)
    async def unknown_agent(request: Request, exc: UnknownAgent) -> JSONResponse:
        known = ", ".join(request.app.state.services.runtime.agents) or "none"
        return _answer(request, 404, f"unknown agent {exc.args[0]!r}; this service runs: {known}")

    @app.exception_handler(redis.RedisError)
    async def redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        log.warning("redis failed: %s: %s", type(exc).__name__, exc)
        reason = f"Redis is unavailable ({type(exc).__name__}); retry shortly"
        return _answer(request, 503, reason, {"Retry-After": "1"})
