"""The policy server: OpenAI-compatible chat completions over the registry's versions.

`POST /v1/chat/completions` (tools, logprobs, n, seed, stop, streaming, token ids),
`GET /v1/models`, `POST /tokenize` (a chat request checked, nothing generated), `GET /healthz`,
`GET /metrics`. Model names: `arloop` (the champion),
`arloop@candidate`, `arloop@v7`; `system_fingerprint` names the version that answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from agents.errors import ArloopError
from deploy import redis_conn
from deploy.body_limit import BodyLimit
from deploy.credentials import PolicyKey
from deploy.logs import setup_logging
from deploy.policy_server.access import Caller, TokenBudget, may_sample_rejected
from deploy.policy_server.admission import Admission
from deploy.policy_server.completions import ServerState, chat_completions
from deploy.policy_server.engines import build_engine, choose_engine
from deploy.policy_server.heads import HeadReader, decide
from deploy.policy_server.heartbeat import Heartbeat
from deploy.policy_server.metrics import PolicyMetrics
from deploy.policy_server.openai_wire import (
    OpenAIError,
    documented,
    error_body,
    error_param,
    tool_format_of,
)
from deploy.policy_server.settings import PolicyServerSettings
from deploy.policy_server.tokenize import tokenize
from deploy.policy_server.versions import Loader, VersionManager
from learner.policy.registry import PolicyRegistry, VersionStatus

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"


def create_app(
    settings: PolicyServerSettings,
    *,
    client: redis.Redis | None = None,
    loader: Loader | None = None,
) -> FastAPI:
    """The app; its lifespan picks the engine, loads the serving versions and starts decoding."""
    if client is None and not settings.redis_url:
        raise ValueError("PolicyServerSettings.redis_url is unset: resolve it with ensure_redis()")

    metrics = PolicyMetrics()
    admission = Admission(
        slots=settings.max_batch_size,
        queue_tokens=settings.policy_queue_tokens,
        queue_wait_s=settings.policy_queue_wait_s,
        grace_s=settings.policy_shutdown_grace_s,
        metrics=metrics,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis_client = client or settings.redis_client(settings.redis_url)
        threads = torch.get_num_threads()
        if settings.threads:
            torch.set_num_threads(settings.threads)  # process-wide: restored at shutdown
        url = f"http://{settings.host}:{settings.port}/v1"
        heartbeat = Heartbeat(redis_client, url, ttl_s=3 * settings.reload_poll_s + 5)
        engine = await asyncio.to_thread(build_engine, settings, metrics.batch_rows.observe)
        log.info("policy engine: %s", engine.label)
        versions = VersionManager(
            redis_client,
            base_model=settings.base_model,
            model_cache=settings.model_cache,
            device=settings.device,
            max_loaded=settings.max_loaded_versions,
            poll_s=settings.reload_poll_s,
            context_length=settings.context_length,
            metrics=metrics,
            loader=loader or engine.loader,
            on_beat=_beat_safely(heartbeat),
        )
        await asyncio.to_thread(versions.start)
        engine.generation.start()
        budget = TokenBudget(settings.key_tokens_per_minute)
        app.state.policy = ServerState(
            settings, versions, engine.generation, metrics, engine.label, budget, admission
        )
        try:
            yield
        finally:
            engine.generation.stop()
            versions.stop()
            heartbeat.stop()
            torch.set_num_threads(threads)

    app = FastAPI(title="arloop policy server", lifespan=lifespan)
    app.state.policy_keys = list(settings.policy_keys)
    app.state.admission = admission  # PolicyServer closes it on SIGTERM
    app.state.heads = HeadReader(settings.base_model, settings.model_cache)
    _install_errors(app)
    app.add_middleware(BodyLimit, max_bytes=settings.policy_max_body_bytes, error=_too_large)
    app.add_middleware(_CountRequests, metrics=metrics)
    stream = {"text/event-stream": {}, "application/json": {}}
    app.post(
        CHAT_PATH,
        responses={200: {"content": stream, "description": "A chat.completion, or its chunks"}}
        | documented(400, 401, 403, 404, 413, 429, 500, 503),
    )(chat_completions)
    app.post("/v1/heads/{name}", responses=documented(400, 401, 403, 404, 413))(decide)
    app.post("/tokenize", responses=documented(400, 401, 403, 404, 413))(tokenize)
    app.get("/v1/models", responses=documented(401, 413))(list_models)
    app.get("/v1/models/{model}", responses=documented(401, 404, 413))(retrieve_model)
    health = {"content": {"application/json": {}}, "description": "Degraded: `problems` say why"}
    app.get("/healthz", responses={503: health} | documented(413))(healthz)
    prometheus = {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."}
    app.get("/metrics", responses={200: prometheus} | documented(413))(metrics_text)
    return app


async def list_models(request: Request, key: Caller) -> dict[str, Any]:
    """The model names this caller may send: the aliases served and every usable version
    (rejected ones to the eval gate's key only)."""
    return {"object": "list", "data": await _models(request, key)}


async def retrieve_model(model: str, request: Request, key: Caller) -> dict[str, Any]:
    """One model name (`models.retrieve`); 404 for a name this caller may not send."""
    for entry in await _models(request, key):
        if entry["id"] == model:
            return entry
    raise OpenAIError(404, f"model {model!r} does not exist", param="model", code="model_not_found")


async def _models(request: Request, key: PolicyKey | None) -> list[dict[str, Any]]:
    st: ServerState = request.app.state.policy
    name = st.settings.served_name
    records = await asyncio.to_thread(st.versions.registry.versions)
    hidden = {VersionStatus.BROKEN} | (
        set() if may_sample_rejected(key) else {VersionStatus.REJECTED}
    )
    ids = [name] + [f"{name}@{alias}" for alias in st.versions.serving()]
    ids += [f"{name}@{r.version}" for r in records if r.status not in hidden]
    created = {f"{name}@{r.version}": int(r.created_at or 0) for r in records}
    return [
        {"id": i, "object": "model", "created": created.get(i, 0), "owned_by": "arloop"}
        for i in ids
    ]


async def healthz(request: Request) -> JSONResponse:
    """What this process serves: aliases, loaded versions, each one's checkpoint digest, its
    queue; 503 with the problems when the registry's champion is not what it serves (it cannot
    load)."""
    st: ServerState = request.app.state.policy
    versions = st.versions
    problems = versions.problems()
    body = {
        "status": "degraded" if problems else "ok",
        "engine": st.engine_label,
        "serving": versions.serving(),
        "loaded": versions.loaded(),
        "digests": versions.digests(),
        "problems": problems,
        "notices": versions.notices,
        "admission": st.admission.state(),
    }
    return JSONResponse(body, status_code=503 if problems else 200)


def _beat_safely(heartbeat: Heartbeat):
    def beat(serving: dict[str, str], digests: dict[str, str]) -> None:
        try:
            heartbeat.beat(serving, digests)
        except redis.RedisError as exc:  # serving goes on; the key expires, the dashboard sees it
            log.warning("heartbeat not written: %s", exc)

    return beat


async def metrics_text(request: Request) -> PlainTextResponse:
    st: ServerState = request.app.state.policy
    return PlainTextResponse(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _answer(exc: ArloopError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers())


def _install_errors(app: FastAPI) -> None:
    """One handler for ArloopError, in OpenAI's shape; invalid bodies and crashes in it too."""

    @app.exception_handler(ArloopError)
    async def _arloop_error(request: Request, exc: ArloopError) -> JSONResponse:
        return _answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _answer(OpenAIError(400, "the request body is not valid JSON", param="body"))
        extra = [e for e in errors if e.get("type") == "extra_forbidden"]
        if extra:
            param = error_param(tuple(extra[0].get("loc", ())))
            message = (
                f"unsupported parameter: {param}: this server does not implement it (the "
                "README's OpenAI compatibility table lists what it does)"
            )
            return _answer(OpenAIError(400, message, param=param, code="unsupported_parameter"))
        first = max(errors, key=lambda e: len(e.get("loc", ())))  # the deepest: most specific
        param = error_param(tuple(first.get("loc", ())))
        message = f"invalid request: {param}: {first.get('msg', 'invalid value')}"
        return _answer(OpenAIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        reason = "the request body is not valid JSON" if exc.status_code == 400 else exc.detail
        error = OpenAIError(exc.status_code, str(reason))
        headers = {**error.headers(), **(exc.headers or {})}
        return JSONResponse(error_body(error), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return _answer(OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}"))


class _CountRequests:
    """ASGI middleware: chat requests by status code and their duration (streams included)."""

    def __init__(self, app, metrics: PolicyMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH:
            return await self.app(scope, receive, send)
        started, status = time.monotonic(), [500]

        async def watch(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.metrics.requests.labels(code=str(status[0])).inc()
            self.metrics.request_seconds.observe(time.monotonic() - started)


def serve() -> None:
    """`arloop serve policy`: settings from ARLOOP_*, Redis (embedded if unset), then uvicorn."""
    from deploy.embedded_redis import StartGuard
    from deploy.start_checks import port_free, refuse
    from learner.policy.models import ModelNotFound, check_base

    settings = PolicyServerSettings()
    setup_logging("policy_server", settings.log_level, settings.log_format)
    # every problem at once (exit 2) before anything starts or the registry records its v0
    refuse(
        lambda: port_free(settings.host, settings.port, "POLICY", "--port"),
        lambda: check_base(settings.base_model, cache_dir=settings.model_cache),
        errors=(ModelNotFound,),
    )
    engine = choose_engine(settings)  # EngineUnavailable (a message, exit 2) before anything starts
    guard, server = StartGuard(), None
    try:
        url = guard.ensure(settings.redis_url, settings.data_dir)
        until = "the policy server starts when it answers (it reads the registry first)"
        redis_conn.wait_for(url, settings, log.warning, until=until)
        redis_conn.check_mode(settings.redis_url, settings)
        # BaseModelMismatch (a message, exit 2) before serving another base than the registry's v0
        PolicyRegistry(settings.redis_client(url)).ensure_base(settings.base_model)
        settings = settings.model_copy(update={"redis_url": url, "policy_engine": engine})
        log.info(
            "policy server on http://%s:%d/v1 (redis %s, base %s, tool format %s, engine %s)",
            settings.host,
            settings.port,
            url,
            settings.base_model,
            tool_format_of(settings),
            engine,
        )
        app = create_app(settings)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level.lower(),
            log_config=None,  # uvicorn's lines, access lines too, go through setup_logging's handler
        )
        server = PolicyServer(config, app.state.admission)
        server.run()
    finally:
        if server is None or not server.started:
            guard.abandon()  # a failed start leaves no embedded Redis behind
    if not server.started:  # the lifespan failed (its log says why), as uvicorn.run exits
        raise SystemExit(3)


class PolicyServer(uvicorn.Server):
    """uvicorn with a bounded shutdown (SIGTERM, SIGINT): admission closes first (queued
    requests 503 now, generating ones cut at `policy_shutdown_grace_s`); uvicorn's own wait for
    connections is cut a few seconds after that, for a request stuck elsewhere (a version
    loading)."""

    def __init__(self, config: uvicorn.Config, admission: Admission) -> None:
        if config.timeout_graceful_shutdown is None:
            config.timeout_graceful_shutdown = admission.grace_s + 5  # type: ignore[assignment]
        super().__init__(config)
        self.admission = admission

    async def shutdown(self, sockets=None) -> None:
        self.admission.close()
        await super().shutdown(sockets)


def _too_large(max_bytes: int) -> dict[str, Any]:
    reason = f"the request body is over {max_bytes} bytes (ARLOOP_POLICY_MAX_BODY_BYTES)"
    return error_body(OpenAIError(413, reason))


if __name__ == "__main__":
    serve()
