"""The agent API: `create_app(settings)` builds the FastAPI app; `serve()` runs it with uvicorn.

Endpoints here: `GET /v1/agents`, `POST /v1/agents/{agent}/runs`, `POST /v1/feedback` (all
with `Authorization: Bearer <key>`), `GET /healthz`, `GET /metrics`; the others come from
their modules' routers: `streaming` (the run as Server-Sent Events), `history` (threads,
runs, feedback pages and export), `review` (the annotation queue and its verdicts), `pages`
(the chat page, the dashboard, the report card, the runs view and the review queue),
`chat_completions` (OpenAI's API for agents arloop does not run itself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import random
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from agents.errors import ArloopError
from agents.events import HEALTH_KEY, STREAM_SHARDS_KEY, check_shards, new_id
from agents.model_routes import ModelRoute, ModelRouteError
from agents.pack_fit import check_fit
from agents.pack_fit import watch_fit as watch_fit_of
from agents.packs.base import Pack
from agents.policy_client import warm_up
from agents.runtime import AgentSpec
from agents.trajectory_sink import Scrub
from deploy import redis_conn
from deploy.agent_api.chat_completions import router as chat_router
from deploy.agent_api.deps import CallerDep, ServicesDep
from deploy.agent_api.errors import install_error_handlers
from deploy.agent_api.external_runs import close_idle_runs
from deploy.agent_api.history import router as history_router
from deploy.agent_api.ingest import FeedbackFastPath, take_feedback
from deploy.agent_api.metrics import ApiMetrics
from deploy.agent_api.pages import STATIC_DIR
from deploy.agent_api.pages import router as pages_router
from deploy.agent_api.review import router as review_router
from deploy.agent_api.runs import acting, admit, answer
from deploy.agent_api.schemas import (
    AgentList,
    FeedbackAccepted,
    FeedbackRequest,
    RunRequest,
    RunResponse,
    errors,
)
from deploy.agent_api.security_headers import SecurityHeaders
from deploy.agent_api.services import open_services, phi_scrubber, score_rule_of
from deploy.agent_api.streaming import router as streaming_router
from deploy.agent_api.users import router as users_router
from deploy.body_limit import BodyLimit
from deploy.embedded_redis import StartGuard, ensure_redis
from deploy.logs import bind, setup_logging
from deploy.settings import AgentApiSettings
from deploy.start_checks import StartRefused, port_free, refuse
from deploy.telemetry import setup_tracing

log = logging.getLogger(__name__)
router = APIRouter()


@router.post(
    "/v1/feedback",
    status_code=202,
    response_model=FeedbackAccepted,
    responses=errors(400, 401, 403, 409, 413, 422, 429, 500, 503),
)
async def feedback(body: FeedbackRequest, caller: CallerDep) -> JSONResponse:
    """Accept feedback on a trajectory, with the token its run returned."""
    # Well-formed posts are answered before routing, by the same function (ingest.py)
    return await take_feedback(caller, body)


@router.get("/healthz", responses=errors(500, 503))
async def healthz(services: ServicesDep) -> dict[str, str]:
    """200 when Redis takes a write; 503 with the reason when it is down or refuses writes
    (full, read-only, a cluster node that holds another part): a run could not be logged. Also
    503 when the streams were laid out with another shard count than this process's."""
    await services.redis.set(HEALTH_KEY, "1", px=10_000)
    shards = services.settings.shards
    await services.redis.set(STREAM_SHARDS_KEY, shards.count, nx=True)
    why = check_shards(await services.redis.get(STREAM_SHARDS_KEY), shards)
    if why:
        raise ArloopError(503, why)
    return {"status": "ok", "redis": "ok"}


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."}},
)
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/agents", response_model=AgentList, responses=errors(401, 503))
async def list_agents(services: ServicesDep, _: CallerDep) -> AgentList:
    """The agents this service runs."""
    return AgentList(agents=[a.spec.public() for a in services.runtime.agents.values()])


@router.post(
    "/v1/agents/{agent}/runs",
    response_model=RunResponse,
    responses=errors(400, 401, 403, 404, 409, 413, 429, 500, 502, 503, 504),
)
async def run_agent(
    agent: str, body: RunRequest, services: ServicesDep, caller: CallerDep
) -> RunResponse:
    """Run an agent on a new or existing thread; the answer carries a feedback token."""
    trajectory_id = new_id("traj")
    bind(trace=trajectory_id)
    body = acting(body, caller)
    await admit(services, agent, body, caller)
    event = await services.runtime.run(
        agent, body.input, body.user_id, body.thread_id, body.metadata, trajectory_id=trajectory_id
    )
    return answer(services, agent, event)


def create_app(
    settings: AgentApiSettings | None = None,
    *,
    specs: list[AgentSpec] | None = None,
    scrubber: Scrub | None = None,
    rng: random.Random | None = None,
    watch_fit: bool = False,
) -> FastAPI:
    """The agent API app; Redis is connected at startup (the embedded one when no URL is set).

    `specs` defaults to the agents of `settings.packs`; `scrubber` to agents.pii's when
    `settings.scrub_phi` is on; `rng` draws canary arms (seed it in tests); `watch_fit`: the
    agents' first calls are checked against the policy server once it answers (a start
    that could not ask it), each misfit an error line.
    """
    settings = settings or AgentApiSettings()
    packs = _load_packs(settings.packs) if specs is None else []
    specs = specs if specs is not None else _agents_of(packs, settings.packs)
    specs = with_models(specs, settings.agent_models)
    score_rule = score_rule_of(packs)
    scrub = scrubber if scrubber is not None else phi_scrubber(settings)
    api_metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        url = settings.redis_url or ensure_redis(None, settings.data_dir)
        await asyncio.to_thread(warm_up)
        services = open_services(settings, url, specs, api_metrics, scrub, rng, score_rule)
        app.state.services = services
        closer = asyncio.create_task(close_idle_runs(services.runs))
        fit = (
            asyncio.create_task(watch_fit_of(specs, settings.policy_config()))
            if watch_fit
            else None
        )
        yield
        closer.cancel()
        if fit is not None:
            fit.cancel()
        await services.redis.aclose()
        services.reader.close()

    app = FastAPI(title="arloop agent API", version="1", lifespan=lifespan)
    app.add_middleware(FeedbackFastPath)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, error=_too_large)
    docs = (app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    app.add_middleware(SecurityHeaders, docs=docs)  # outermost: its 413 gets the headers too
    install_error_handlers(app)
    routers = (router, streaming_router, history_router, review_router, pages_router, users_router)
    for routes in (*routers, chat_router):
        app.include_router(routes)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.openapi = lambda: _openapi(app, [s.name for s in specs], settings.max_input_chars)
    return app


def _openapi(app: FastAPI, agents: list[str], max_input_chars: int) -> dict:
    """FastAPI's schema with what only this app knows: the agents it serves (the `{agent}`
    path's values) and the longest input it takes, so clients and schemathesis see both."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for path in schema["paths"].values():
            for operation in path.values():
                for param in operation.get("parameters", []):
                    if param["name"] == "agent" and param["in"] == "path":
                        param["schema"]["enum"] = agents
        run = schema["components"]["schemas"]["RunRequest"]["properties"]["input"]
        run["maxLength"] = max_input_chars
        _declare_bearer(schema)
    return app.openapi_schema


def _declare_bearer(schema: dict) -> None:
    """The bearer scheme on every operation that can answer 401 (the key is checked by one
    plain dependency, not FastAPI's HTTPBearer, which the schema would otherwise show)."""
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["HTTPBearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "One of ARLOOP_API_KEYS.",
    }
    for path in schema["paths"].values():
        for operation in path.values():
            if "401" in operation.get("responses", {}):
                operation["security"] = [{"HTTPBearer": []}]


def with_models(specs: list[AgentSpec], routes: dict[str, ModelRoute]) -> list[AgentSpec]:
    """`specs` with ARLOOP_AGENT_MODELS' routes over their packs' own `AgentSpec.model`."""
    names = {s.name for s in specs}
    unknown = sorted(set(routes) - names)
    if unknown:
        raise ModelRouteError(
            f"ARLOOP_AGENT_MODELS names {', '.join(map(repr, unknown))}, which no served pack "
            f"has (agents: {', '.join(sorted(names)) or 'none'}): fix the agent's name there, "
            "or ARLOOP_PACKS"
        )
    return [dataclasses.replace(s, model=routes[s.name]) if s.name in routes else s for s in specs]


def _agents_of(packs: list[Pack], refs: list[str]) -> list[AgentSpec]:
    from agents.packs import PackNotFound, agents_of

    try:
        return agents_of(packs, refs)
    except PackNotFound as exc:
        raise PackNotFound(f"{exc}; fix ARLOOP_PACKS") from exc


def _load_packs(refs: list[str]) -> list[Pack]:
    from agents.packs import PackNotFound, get_pack

    try:
        return [get_pack(ref) for ref in refs]
    except PackNotFound as exc:
        raise PackNotFound(f"{exc}; fix ARLOOP_PACKS") from exc


def serve() -> None:
    """`arloop serve agents`: settings from ARLOOP_*, Redis ensured, uvicorn on uvloop."""
    import uvicorn

    settings = AgentApiSettings()
    setup_logging("agent_api", settings.log_level, settings.log_format)
    setup_tracing("agent_api", settings.otlp_endpoint)
    fitted = _check_start(settings)  # StartRefused, every problem at once, before Redis starts
    guard, server = StartGuard(), None
    try:
        url = guard.ensure(settings.redis_url, settings.data_dir)
        until = "/healthz reports not ready until it answers"
        redis_conn.wait_for(url, settings, log.warning, until=until, background=True)
        redis_conn.check_mode(settings.redis_url, settings)  # a cluster without the cluster client
        redis_conn.claim_shards_at(url, settings, settings.shards)  # the streams' shard count
        app = create_app(settings.model_copy(update={"redis_url": url}), watch_fit=not fitted)
        server = uvicorn.Server(_uvicorn_config(app, settings))
        server.run()
    finally:
        if server is None or not server.started:
            guard.abandon()  # a failed start leaves no embedded Redis behind
    if not server.started:  # the lifespan failed (its log says why), as uvicorn.run exits
        raise SystemExit(3)


def _uvicorn_config(app: FastAPI, settings: AgentApiSettings):
    import uvicorn

    # uvloop + httptools roughly doubled an ingest endpoint's rate here; both are optional.
    fast = all(importlib.util.find_spec(m) for m in ("uvloop", "httptools"))
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        loop="uvloop" if fast else "auto",
        http="httptools" if fast else "auto",
        log_config=None,  # uvicorn's lines go through setup_logging's handler
        access_log=False,  # a line per run instead: an access line per feedback costs ingest rate
    )


def _check_start(settings: AgentApiSettings) -> bool:
    """The port is free, the packs load with their agents' models, and their first calls fit
    the policy server's model: all problems at once. False when the policy server did not
    answer, so the fit is still to be checked (`watch_fit`, once it answers)."""
    from agents.packs import PackNotFound
    from agents.spec_checks import AgentSpecError

    specs: list[AgentSpec] = []
    unchecked: list[str] = []

    def agents() -> None:
        specs.extend(
            with_models(
                _agents_of(_load_packs(settings.packs), settings.packs), settings.agent_models
            )
        )

    def fit() -> None:
        if not specs:  # the packs did not load: that is the problem to fix first
            return
        found = check_fit(specs, settings.policy_config())
        unchecked.append(found.unchecked)
        if found.problems:
            raise StartRefused(found.problems)

    refuse(
        lambda: port_free(settings.host, settings.port, "AGENTS", "--port"),
        agents,
        fit,
        errors=(PackNotFound, ModelRouteError, AgentSpecError),
    )
    if any(unchecked):  # said only by a start that goes on
        log.warning("%s", unchecked[0])
    return not any(unchecked)


def _too_large(max_bytes: int) -> dict[str, str]:
    return {"detail": f"request body is over {max_bytes} bytes (ARLOOP_MAX_BODY_BYTES)"}
