"""`POST /v1/feedback`, the API's highest-rate request: one function takes the feedback, and an
ASGI middleware serves the common case of that request before the framework's routing.

Feedback posts come at many times the rate of runs, and for them FastAPI's routing, dependency
solving and body handling cost more CPU than the intake's own work (token check, value check,
rate windows, replay marker and XADD). `FeedbackFastPath` answers a post that is well formed
from the start (a JSON body that `FeedbackRequest` accepts and a known API key) with the same
checks, the same `take_feedback` and the same error answers (`errors.error_response`) as the
route in `app.py`. Anything else, a bad key, a body that does not parse or validate, another
content type, goes on to that route unchanged (the body replayed), so every refusal is the
framework's own, as the OpenAPI schema documents it. `bench/bench_feedback_ingest.py` measures
the difference.
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agents.errors import ArloopError
from agents.events import FeedbackKind
from agents.feedback_intake import FeedbackSubmission
from deploy.agent_api.deps import Caller, require_api_key
from deploy.agent_api.errors import error_response
from deploy.agent_api.schemas import FeedbackRequest
from deploy.body_limit import replay
from deploy.logs import bind

PATH = "/v1/feedback"


async def take_feedback(caller: Caller, body: FeedbackRequest) -> JSONResponse:
    """The 202 answer for accepted feedback, the outcome counted either way (the intake's
    refusals raise, for the error handlers to answer)."""
    services = caller.services
    bind(trace=body.trajectory_id)
    kind = body.kind if body.kind in FeedbackKind.__members__.values() else "invalid"
    try:
        submission = FeedbackSubmission(
            body.trajectory_id,
            body.feedback_token,
            body.kind,
            body.value if body.score is None else body.score,
            body.text if body.comment is None else body.comment,
            caller.user(body.user_id),
            body.turn,
            caller.key.name,
            caller.rate_per_minute(services.settings.key_rate_per_minute),
            key=body.key,
            tenant=caller.key.tenant,
        )
        event_id = await services.intake.accept(submission)
    except Exception as exc:
        outcome = str(exc.status) if isinstance(exc, ArloopError) else "error"
        services.metrics.feedback_counted(kind, outcome).inc()
        raise
    services.metrics.feedback_counted(kind, "accepted").inc()
    return JSONResponse({"event_id": event_id}, status_code=202)


class FeedbackFastPath:
    """ASGI middleware: serves well-formed `POST /v1/feedback` requests; passes on the rest.

    Install it inside the body limit (`deploy.body_limit.BodyLimit`), which bounds what it
    reads."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body = await _read_body(receive)
        if body is None:  # the client left
            return None
        response = await _answer(scope, body)
        if response is None:
            return await self.app(scope, replay(body, receive), send)
        return await response(scope, receive, send)


async def _answer(scope, body: bytes) -> Response | None:
    """The answer to a well-formed post; None to let the route answer it."""
    if _content_type(scope) != b"application/json":
        return None
    request = Request(scope)
    try:
        caller = await require_api_key(request)
        parsed = FeedbackRequest.model_validate_json(body)
    except (ArloopError, ValidationError, ValueError, RecursionError):
        return None  # the route refuses it as the schema says (401, 400 or 422)
    try:
        return await take_feedback(caller, parsed)
    except Exception as exc:
        answer = await error_response(request, exc)
        if answer is None:
            raise
        return answer


def _content_type(scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower()
    return None


async def _read_body(receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
