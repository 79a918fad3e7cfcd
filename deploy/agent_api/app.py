"""The agent API: `create_app(settings)` builds the FastAPI app; `serve()` runs it with uvicorn.

Endpoints: `GET /v1/agents`, `POST /v1/agents/{agent}/runs`, `POST /v1/feedback` (all with
`Authorization: Bearer <key>`), `GET /healthz`, `GET /metrics`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import random
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agents.errors import ArloopError
from agents.events import FeedbackKind, new_id
from agents.feedback_intake import FeedbackSubmission
from agents.feedback_tokens import issue
from agents.policy_client import warm_up
from agents.runtime import AgentSpec
from agents.trajectory_sink import Scrub
from deploy.agent_api.deps import ApiKey, ServicesDep
from deploy.agent_api.errors import install_error_handlers
from deploy.agent_api.limits import BodySizeLimit
from deploy.agent_api.metrics import ApiMetrics
from deploy.agent_api.schemas import (
    AgentList,
    FeedbackAccepted,
    FeedbackRequest,
    RunRequest,
    RunResponse,
)
from deploy.agent_api.services import open_services, phi_scrubber
from deploy.embedded_redis import ensure_redis
from deploy.logs import bind, setup_logging
from deploy.settings import AgentApiSettings

log = logging.getLogger(__name__)
router = APIRouter()


@router.get("/healthz")
async def healthz(services: ServicesDep) -> dict[str, str]:
    """200 when Redis answers; 503 with the reason when it does not."""
    await services.redis.ping()
    return {"status": "ok", "redis": "ok"}


@router.get("/metrics")
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/agents", response_model=AgentList)
async def list_agents(services: ServicesDep, _: ApiKey) -> AgentList:
    """The agents this service runs."""
    return AgentList(agents=[a.spec.public() for a in services.runtime.agents.values()])


@router.post("/v1/agents/{agent}/runs", response_model=RunResponse)
async def run_agent(agent: str, body: RunRequest, services: ServicesDep, _: ApiKey) -> RunResponse:
    """Run an agent on a new or existing thread; the answer carries a feedback token."""
    settings = services.settings
    trajectory_id = new_id("traj")
    bind(trace=trajectory_id)
    services.runtime.spec(agent)
    if len(body.input) > settings.max_input_chars:
        raise ArloopError(
            413,
            f"input has {len(body.input)} characters; the limit is "
            f"{settings.max_input_chars} (ARLOOP_MAX_INPUT_CHARS)",
        )
    await services.limiter.hit("runs", body.user_id, settings.run_rate_per_minute)
    event = await services.runtime.run(
        agent, body.input, body.user_id, body.thread_id, body.metadata, trajectory_id=trajectory_id
    )
    bind(version=event.policy_version)
    services.metrics.observe_run(event)
    log.info(  # ids and counts only: input and output are user text
        "run of %s on thread %s: %s (answered by %s), %d model and %d tool calls, %.0f ms",
        agent,
        event.thread_id,
        event.status.value,
        event.answered_by.value,
        len(event.model_steps),
        len(event.tool_steps),
        (event.finished_at - event.started_at) * 1000,
    )
    token = issue(
        settings.secret_key,
        event.trajectory_id,
        event.user_id,
        event.policy_version,
        settings.feedback_token_ttl_s,
    )
    return RunResponse(
        trajectory_id=event.trajectory_id,
        thread_id=event.thread_id,
        output=event.output,
        policy_version=event.policy_version,
        feedback_token=token,
        status=event.status.value,
        answered_by=event.answered_by.value,
        tools=[s.name for s in event.tool_steps if s.name in services.runtime.agents[agent].tools],
    )


@router.post("/v1/feedback", status_code=202, response_model=FeedbackAccepted)
async def feedback(body: FeedbackRequest, services: ServicesDep, _: ApiKey) -> FeedbackAccepted:
    """Accept feedback on a trajectory, with the token its run returned."""
    bind(trace=body.trajectory_id)
    kind = body.kind if body.kind in FeedbackKind.__members__.values() else "invalid"
    try:
        event_id = await services.intake.accept(FeedbackSubmission(**body.model_dump()))
    except Exception as exc:  # counted, then answered by the error handlers
        outcome = str(exc.status) if isinstance(exc, ArloopError) else "error"
        services.metrics.feedback.labels(kind, outcome).inc()
        raise
    services.metrics.feedback.labels(kind, "accepted").inc()
    return FeedbackAccepted(event_id=event_id)


def create_app(
    settings: AgentApiSettings | None = None,
    *,
    specs: list[AgentSpec] | None = None,
    scrubber: Scrub | None = None,
    rng: random.Random | None = None,
) -> FastAPI:
    """The agent API app; Redis is connected at startup (the embedded one when no URL is set).

    `specs` defaults to the agents of `settings.packs`; `scrubber` to agents.pii's when
    `settings.scrub_phi` is on; `rng` draws canary arms (seed it in tests).
    """
    settings = settings or AgentApiSettings()
    specs = specs if specs is not None else _load_packs(settings.packs)
    scrub = scrubber if scrubber is not None else phi_scrubber(settings)
    api_metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        url = settings.redis_url or ensure_redis(None, settings.data_dir)
        await asyncio.to_thread(warm_up)
        services = open_services(settings, url, specs, api_metrics, scrub, rng)
        app.state.services = services
        yield
        await services.redis.aclose()

    app = FastAPI(title="arloop agent API", version="1", lifespan=lifespan)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    install_error_handlers(app)
    app.include_router(router)
    return app


def _load_packs(refs: list[str]) -> list[AgentSpec]:
    from agents.packs import PackNotFound, load_packs

    try:
        return load_packs(refs)
    except PackNotFound as exc:
        raise PackNotFound(f"{exc}; fix ARLOOP_PACKS") from exc


def serve() -> None:
    """`arloop serve agents`: settings from ARLOOP_*, Redis ensured, uvicorn on uvloop."""
    import uvicorn

    settings = AgentApiSettings()
    setup_logging("agent_api", settings.log_level, settings.log_format)
    url = ensure_redis(settings.redis_url, settings.data_dir)
    app = create_app(settings.model_copy(update={"redis_url": url}))
    # uvloop + httptools roughly doubled an ingest endpoint's rate here; both are optional.
    fast = all(importlib.util.find_spec(m) for m in ("uvloop", "httptools"))
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        loop="uvloop" if fast else "auto",
        http="httptools" if fast else "auto",
        log_config=None,  # uvicorn's lines go through setup_logging's handler
        access_log=False,  # a line per run instead: an access line per feedback costs ingest rate
    )
