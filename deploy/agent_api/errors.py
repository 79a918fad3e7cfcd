"""How failures become answers: `{"detail": reason}` with a status, never a bare 500 for bad input.

One handler answers every `ArloopError` (tokens, threads, feedback, rate limits, unknown agents,
the policy endpoint's 502/504); Redis being down, full (OOM), read-only or a cluster node that
points elsewhere is a 503 saying which, and another command Redis refused a 500 naming its kind:
never Redis's own message, which names internal keys (the operator's log has it). Bodies that
do not validate keep FastAPI's 422 shape, with each echoed input made safe to send: FastAPI's
own handler echoes NaN, Infinity or a lone surrogate as it came and then fails to serialise it
(a 500 for bad input).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import redis
import redis.exceptions as redis_errors
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from agents.errors import ArloopError
from deploy.agent_api.chat_wire import error_param

log = logging.getLogger(__name__)


class Unauthorized(ArloopError):
    """401 with the `WWW-Authenticate: Bearer` challenge."""

    def __init__(self, reason: str) -> None:
        super().__init__(401, reason)

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


OPENAI_PATHS = ("/v1/chat/completions", "/v1/models")
"""Routes that speak OpenAI's wire format: their errors are `{"error": {message, type, param,
code}}`, as the OpenAI SDK reads them, and a body that does not validate is a 400 naming the
field (`deploy.agent_api.chat_wire`)."""


def _answer(request: Request, exc: ArloopError) -> JSONResponse:
    """The response for an error, counted by status."""
    where = (getattr(exc, "param", None), getattr(exc, "code", None))
    return _answer_detail(request, exc.status, exc.reason, exc.headers(), where)


async def arloop_error(request: Request, exc: ArloopError) -> JSONResponse:
    if exc.status >= 500:  # a fault on our side (the policy endpoint): the operator's to see
        log.warning("%d on %s: %s", exc.status, request.url.path, exc.reason)
    return _answer(request, exc)


async def redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
    log.warning("redis failed: %s: %s", type(exc).__name__, exc)
    return _answer(request, redis_refusal(exc))


async def cluster_unreachable(request: Request, exc: Exception) -> JSONResponse:
    """redis-py's cluster client failing outside `RedisError` (no node answers, a slot without
    a node): the cluster is down for this process, a 503 as any Redis outage."""
    log.warning("redis cluster failed: %s: %s", type(exc).__name__, exc)
    reason = f"the Redis Cluster is unreachable ({type(exc).__name__}); retry shortly"
    return _answer(request, ArloopError(503, reason, retry_after=5))


CLUSTER_REPLIES = (
    redis_errors.AskError,  # MOVED too
    redis_errors.ClusterCrossSlotError,
    redis_errors.TryAgainError,
)
REFUSALS: tuple[tuple[type[redis.RedisError], str], ...] = (
    (
        redis_errors.OutOfMemoryError,
        "Redis is full (maxmemory reached) and refuses writes: nothing was written; retry "
        "later (the operator raises maxmemory or lowers ARLOOP_STREAM_MAX_ENTRIES)",
    ),
    (
        redis_errors.ReadOnlyError,
        "Redis is a read-only replica (a failover is under way or ARLOOP_REDIS_URL names a "
        "replica): nothing was written; retry shortly",
    ),
    (
        redis_errors.MasterDownError,
        "Redis has lost its primary: nothing was written; retry shortly",
    ),
    (
        redis_errors.ClusterDownError,
        "the Redis cluster is down (a master unreachable, or slots without a node; a node of "
        "a cluster needs ARLOOP_REDIS_CLUSTER=true): nothing was written; retry shortly",
    ),
    (
        redis_errors.ClusterError,
        "Redis is a cluster and this node holds another part of it: set "
        "ARLOOP_REDIS_CLUSTER=true so that this process follows the cluster",
    ),
    (redis_errors.ResponseError, ""),
)
"""Redis's refusals that are a 503 (retry later, nothing written), by class; the last entry
catches the rest (a 500)."""


def redis_refusal(exc: redis.RedisError) -> ArloopError:
    """The answer to a Redis failure: 503 with a reason for an outage or a refusal to write,
    500 for another refused command; never Redis's message (it names internal keys)."""
    if isinstance(exc, CLUSTER_REPLIES):
        exc = redis_errors.ClusterError()
    for cls, reason in REFUSALS:
        if isinstance(exc, cls) and reason:
            return ArloopError(503, reason, retry_after=5)
    if isinstance(exc, redis.ResponseError) and not isinstance(exc, redis.BusyLoadingError):
        # Redis answered and refused: a fault of ours or of its configuration, not an outage
        reason = f"Redis refused a command ({type(exc).__name__}); the operator's log has it"
        return ArloopError(500, reason)
    return ArloopError(503, f"Redis is unavailable ({type(exc).__name__}); retry shortly", 1)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    detail = [_safe_error(e) for e in exc.errors()]
    if request.url.path in OPENAI_PATHS:
        first = exc.errors()[0]
        param = error_param(tuple(first.get("loc", ())))
        if first.get("type") == "extra_forbidden":
            reason = f"{param} is not supported by arloop's policy: leave it out"
        else:
            reason = f"{param}: {first.get('msg')}"
        return _answer_detail(request, 400, reason, None, (param, "invalid_request"))
    return _answer_detail(request, 422, detail)


async def http_error(request: Request, exc: HTTPException):
    """FastAPI's "error parsing the body" 400 with the reason its cause gives, and a 405
    whose `Allow` lists every method of the path (Starlette names only those of the
    first route matching it: `OPTIONS /v1/feedback` said `Allow: POST`, though GET
    serves it too); the rest as FastAPI answers them."""
    if exc.status_code == 405:
        exc.headers = (exc.headers or {}) | {"Allow": _methods(request.app, request.url.path)}
    if exc.status_code != 400 or exc.__cause__ is None:
        return await http_exception_handler(request, exc)
    return _answer(request, ArloopError(400, _unreadable(exc.__cause__)))


HANDLERS = (
    (ArloopError, arloop_error),
    (redis.RedisError, redis_down),
    (redis_errors.RedisClusterException, cluster_unreachable),
    (RequestValidationError, invalid_request),
    (HTTPException, http_error),
)
"""What the app answers for each kind of failure, in the order they are checked."""


def install_error_handlers(app: FastAPI) -> None:
    for cls, handler in HANDLERS:
        app.add_exception_handler(cls, handler)


async def error_response(request: Request, exc: Exception) -> Response | None:
    """The answer the app's handlers give `exc` (for code that runs before the app's routing,
    `deploy.agent_api.ingest`); None for an exception they do not answer."""
    for cls, handler in HANDLERS:
        if isinstance(exc, cls):
            return await handler(request, exc)
    return None


def _unreadable(cause: BaseException) -> str:
    if isinstance(cause, RecursionError):
        what = "it is nested too deeply"
    elif isinstance(cause, UnicodeDecodeError):
        what = "it is not valid UTF-8"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        what = "it holds an integer of more than 4300 digits"
    else:
        what = f"it could not be parsed ({type(cause).__name__})"
    return f"the request body is not JSON this API can read: {what}"


def _answer_detail(
    request: Request,
    status: int,
    detail: Any,
    headers: dict[str, str] | None = None,
    where: tuple[str | None, str | None] = (None, None),
) -> JSONResponse:
    """`{"detail": detail}` with a status (OpenAI's shape on `OPENAI_PATHS`, with `where`: the
    param and code), counted by status."""
    services = getattr(request.app.state, "services", None)
    if services is not None:
        services.metrics.errors.labels(str(status)).inc()
    body: dict[str, Any] = {"detail": detail}
    if request.url.path in OPENAI_PATHS:
        kind = "invalid_request_error" if status < 500 else "server_error"
        kind = {401: "authentication_error", 429: "rate_limit_exceeded"}.get(status, kind)
        message = detail if isinstance(detail, str) else str(detail)
        body = {"error": {"message": message, "type": kind, "param": where[0], "code": where[1]}}
    return JSONResponse(body, status_code=status, headers=headers)


def _safe_error(error: dict[str, Any]) -> dict[str, Any]:
    """One pydantic error with every value JSON can carry: the input clipped and escaped."""
    out = {k: _safe(v) for k, v in error.items() if k in ("type", "loc", "msg", "ctx")}
    if "input" in error:
        out["input"] = _safe(error["input"], depth=2)
    return out


def _safe(value: Any, depth: int = 4) -> Any:
    """`value` as strict JSON: non-finite numbers and lone surrogates as text, long text
    clipped, containers cut at `depth` (deeply nested input is echoed as `...`)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else str(value)[:40]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value[:200].encode("utf-8", "backslashreplace").decode("utf-8")
    if depth <= 0:
        return "..."
    if isinstance(value, dict):
        return {_safe(str(k)): _safe(v, depth - 1) for k, v in list(value.items())[:20]}
    if isinstance(value, list | tuple):
        return [_safe(v, depth - 1) for v in list(value)[:20]]
    return _safe(str(value))


def _methods(app: FastAPI, path: str) -> str:
    found: set[str] = set()
    for route in app.router.routes:
        if getattr(route, "methods", None) and route.path_regex.match(path):
            found |= route.methods
    return ", ".join(sorted(found))
