"""The policy server: OpenAI-compatible chat completions over the registry's versions.

`POST /v1/chat/completions` (tools, logprobs, n, seed, stop, streaming, token ids),
`GET /v1/models`, `GET /healthz`, `GET /metrics`. Model names: `arloop` (the champion),
`arloop@candidate`, `arloop@v7`; `system_fingerprint` names the version that answered.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import redis
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask

from agents.errors import ArloopError
from deploy.logs import bind, setup_logging
from deploy.policy_server.engines import build_engine, choose_engine
from deploy.policy_server.heartbeat import Heartbeat
from deploy.policy_server.metrics import PolicyMetrics
from deploy.policy_server.openai_wire import (
    ChatRequest,
    OpenAIError,
    completion_body,
    error_body,
    error_param,
    prepare,
    target_of,
    tool_format_of,
)
from deploy.policy_server.stream import ChoiceStream, ChunkWriter, sse
from deploy.policy_server.versions import LoadedPolicy, Loader, VersionManager, VersionUnavailable
from deploy.settings import PolicyServerSettings
from learner.policy.generation.engine import FinishEvent, GenerationEngine, Row
from learner.policy.registry import PolicyRegistry, UnknownVersion, VersionStatus

log = logging.getLogger(__name__)
CHAT_PATH = "/v1/chat/completions"


@dataclass
class ServerState:
    settings: PolicyServerSettings
    versions: VersionManager
    engine: GenerationEngine
    metrics: PolicyMetrics
    engine_label: str  # `llamacpp-f16` or `transformers-fp32`: which numerics gave the logprobs


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

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis_client = client or redis.Redis.from_url(settings.redis_url)
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
        app.state.policy = ServerState(settings, versions, engine.generation, metrics, engine.label)
        try:
            yield
        finally:
            engine.generation.stop()
            versions.stop()
            heartbeat.stop()
            torch.set_num_threads(threads)

    app = FastAPI(title="arloop policy server", lifespan=lifespan)
    _install_errors(app)
    app.add_middleware(_CountRequests, metrics=metrics)
    app.post(CHAT_PATH)(chat_completions)
    app.get("/v1/models")(list_models)
    app.get("/healthz")(healthz)
    app.get("/metrics")(metrics_text)
    return app


async def chat_completions(req: ChatRequest, request: Request):
    """OpenAI's chat completions; `stream: true` answers with server-sent events."""
    st: ServerState = request.app.state.policy
    request_id = f"chatcmpl-{secrets.token_hex(12)}"
    bind(trace=request_id)
    policy = await _lease(st, target_of(req.model, st.settings.served_name))
    bind(version=policy.version)
    try:
        prompt_ids, params = prepare(req, policy.tokenizer, policy.context, st.settings)
    except BaseException:
        st.versions.release(policy)
        raise
    st.metrics.prompt_tokens.inc(len(prompt_ids))
    run = _Run(st, policy, prompt_ids, params, stream=req.stream)
    if req.stream:
        # close() runs when the stream ends, and again (a no-op) after the response: a client
        # that leaves before the first chunk never starts the generator, so never runs its finally.
        events = _stream(req, run, request_id)
        return StreamingResponse(
            events, media_type="text/event-stream", background=BackgroundTask(run.close)
        )
    try:
        finishes = await run.finishes()
    finally:
        run.close()
    failed = [f for f in finishes if f.finish_reason == "error"]
    if failed:
        raise OpenAIError(500, f"generation failed: {failed[0].error}", code="generation_error")
    return completion_body(
        req,
        request_id=request_id,
        version=policy.version,
        tokenizer=policy.tokenizer,
        prompt_ids=prompt_ids,
        finishes=finishes,
        tool_format=tool_format_of(st.settings),
        engine=st.engine_label,
    )


async def list_models(request: Request) -> dict[str, Any]:
    """The model names clients may send: the aliases served and every usable version."""
    st: ServerState = request.app.state.policy
    name = st.settings.served_name
    records = await asyncio.to_thread(st.versions.registry.versions)
    ids = [name] + [f"{name}@{alias}" for alias in st.versions.serving()]
    ids += [f"{name}@{r.version}" for r in records if r.status is not VersionStatus.BROKEN]
    return {
        "object": "list",
        "data": [{"id": i, "object": "model", "created": 0, "owned_by": "arloop"} for i in ids],
    }


async def healthz(request: Request) -> dict[str, Any]:
    """What this process serves: aliases, loaded versions, and each one's checkpoint digest."""
    st: ServerState = request.app.state.policy
    versions = st.versions
    return {
        "status": "ok",
        "engine": st.engine_label,
        "serving": versions.serving(),
        "loaded": versions.loaded(),
        "digests": versions.digests(),
    }


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


class _Run:
    """One request's rows in the engine, the queue their events come back on, and its lease."""

    def __init__(self, st: ServerState, policy: LoadedPolicy, prompt_ids, params, stream: bool):
        loop = asyncio.get_running_loop()
        self.st, self.policy, self.finished = st, policy, []
        self.queue: asyncio.Queue = asyncio.Queue()
        self._closed = False

        def emit(event) -> None:
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, event)
            except RuntimeError:  # the loop is gone (shutdown): nobody is listening
                pass

        self.rows = [
            Row(policy, prompt_ids, p, emit, index=i, stream=stream) for i, p in enumerate(params)
        ]
        st.engine.submit(self.rows)

    async def events(self) -> AsyncIterator[Any]:
        pending = len(self.rows)
        while pending:
            event = await self.queue.get()
            if isinstance(event, FinishEvent):
                pending -= 1
                self.finished.append(event)
            yield event

    async def finishes(self) -> list[FinishEvent]:
        return [e async for e in self.events() if isinstance(e, FinishEvent)]

    def close(self) -> None:
        """Stop rows nobody waits for, count tokens, end the lease; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for row in self.rows:
            row.cancelled = row.finish_reason is None
        generated = sum(len(f.token_ids) for f in self.finished)
        self.st.metrics.generated_tokens.labels(version=self.policy.version).inc(generated)
        self.st.versions.release(self.policy)


async def _stream(req: ChatRequest, run: _Run, rid: str):
    writer = ChunkWriter(req, rid, run.policy.version)
    fmt = tool_format_of(run.st.settings)
    choices = [ChoiceStream(req, i, run.policy.tokenizer, fmt) for i in range(len(run.rows))]
    extra = {"engine": run.st.engine_label}
    if req.return_token_ids:
        extra["prompt_token_ids"] = run.rows[0].prompt_ids
    try:
        yield writer.chunk([c.first() for c in choices], **extra)
        async for ev in run.events():
            if not isinstance(ev, FinishEvent):
                delta = choices[ev.index].on_token(ev)
                if delta is not None:
                    yield writer.chunk([delta])
                continue
            if ev.finish_reason == "error":
                yield sse(error_body(OpenAIError(500, f"generation failed: {ev.error}")))
                break
            for delta in choices[ev.index].on_finish(ev):
                yield writer.chunk([delta])
        if req.stream_options and req.stream_options.include_usage:
            completion = sum(len(f.token_ids) for f in run.finished)
            usage = {
                "prompt_tokens": len(run.rows[0].prompt_ids),
                "completion_tokens": completion,
                "total_tokens": len(run.rows[0].prompt_ids) + completion,
            }
            yield writer.chunk([], usage=usage)
        yield sse("[DONE]")
    finally:
        run.close()  # also when the client left early: stop generating for it


async def _lease(st: ServerState, target: str) -> LoadedPolicy:
    policy = st.versions.acquire_loaded(target)
    if policy is not None:
        return policy
    try:
        return await asyncio.to_thread(st.versions.acquire, target)
    except UnknownVersion:
        raise OpenAIError(
            404,
            f"version {target!r} does not exist in the policy registry",
            param="model",
            code="model_not_found",
        ) from None
    except VersionUnavailable as exc:
        raise OpenAIError(404, str(exc), param="model", code="model_not_found") from None


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
        first = max(errors, key=lambda e: len(e.get("loc", ())))  # the deepest: most specific
        param = error_param(tuple(first.get("loc", ())))
        message = f"invalid request: {param}: {first.get('msg', 'invalid value')}"
        return _answer(OpenAIError(400, message, param=param))

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
    import uvicorn

    from deploy.embedded_redis import ensure_redis

    settings = PolicyServerSettings()
    setup_logging("policy_server", settings.log_level, settings.log_format)
    engine = choose_engine(settings)  # EngineUnavailable (a message, exit 2) before anything starts
    url = ensure_redis(settings.redis_url, settings.data_dir)
    # BaseModelMismatch (a message, exit 2) before serving another base than the registry's v0
    PolicyRegistry(redis.Redis.from_url(url, **settings.redis_options(url))).ensure_base(
        settings.base_model
    )
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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's lines, access lines too, go through setup_logging's handler
    )


if __name__ == "__main__":
    serve()
