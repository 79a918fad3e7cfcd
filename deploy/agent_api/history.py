"""Routes that read history back: a thread's messages, runs and feedback pages, one run whole,
the JSONL export."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from pydantic import WithJsonSchema

from agents.errors import ArloopError
from agents.events import AnswerPath, FeedbackKind, RunStatus
from deploy.agent_api.deps import CallerDep, ServicesDep
from deploy.agent_api.feedback_log import SECONDS, export_jsonl, feedback_page
from deploy.agent_api.run_log import FEEDBACK_FILTERS, RunFilter, run_detail, runs_page
from deploy.agent_api.schemas import (
    FeedbackPage,
    ThreadId,
    ThreadMessage,
    ThreadView,
    UserId,
    errors,
)
from deploy.agent_api.stream_merge import CURSOR

router = APIRouter()
AgentName = Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
Since = Annotated[
    str | None,
    Query(
        max_length=40,
        description="Seconds since the epoch (digits), or an RFC 3339 time "
        "(`2026-01-01T00:00:00Z`).",
    ),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": SECONDS},
                {"type": "string", "format": "date-time"},
            ]
        }
    ),
]
Until = Annotated[
    str | None,
    Query(max_length=40, description="Before this time (the same forms as `since`)."),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": SECONDS},
                {"type": "string", "format": "date-time"},
            ]
        }
    ),
]
Kind = Annotated[
    str | None,
    Query(max_length=32),
    WithJsonSchema({"type": "string", "enum": [k.value for k in FeedbackKind]}),
]
Cursor = Annotated[
    str | None,
    Query(max_length=48, description="`next_cursor` of the previous page."),
    WithJsonSchema({"type": "string", "pattern": CURSOR}),  # checked with a reason (422)
]


@router.get(
    "/v1/threads/{thread_id}", response_model=ThreadView, responses=errors(401, 404, 422, 503)
)
async def get_thread(
    thread_id: ThreadId,
    user_id: Annotated[UserId, Query(description="The user the thread belongs to.")],
    services: ServicesDep,
    caller: CallerDep,
) -> ThreadView:
    """A thread's messages, for its own user only (another user's thread is a 404)."""
    found = await services.runtime.thread_messages(thread_id, caller.user(user_id))
    if found is None:
        raise ArloopError(404, f"no thread {thread_id!r} for user {user_id!r}")
    record, messages = found
    created = record.get("created_at")
    return ThreadView(
        thread_id=thread_id,
        agent=record["agent"],
        user_id=user_id,
        created_at=float(created) if created else None,
        messages=[m for m in map(_message, messages) if m is not None],
    )


@router.get("/v1/feedback", response_model=FeedbackPage, responses=errors(401, 404, 422, 503))
async def list_feedback(
    services: ServicesDep,
    caller: CallerDep,
    agent: AgentName = None,
    since: Since = None,
    kind: Kind = None,
    cursor: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> FeedbackPage:
    """Accepted feedback on the caller's tenant's runs (or its one user's, for a key that acts as
    one user), oldest first, filtered by agent, time and kind; pages by `cursor`."""
    if agent is not None:
        services.runtime.spec(agent)  # 404 naming the agents this service runs
    return await feedback_page(
        services.redis,
        sees=caller.sees,
        agent=agent,
        since=since,
        kind=kind,
        cursor=cursor,
        limit=limit,
        shards=services.settings.shards,
    )


@router.get("/v1/runs", responses=errors(401, 404, 422, 503))
async def list_runs(
    services: ServicesDep,
    caller: CallerDep,
    agent: AgentName = None,
    version: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")] = None,
    status: Annotated[
        str | None, Query(max_length=32, json_schema_extra={"enum": [s.value for s in RunStatus]})
    ] = None,
    answered_by: Annotated[
        str | None, Query(max_length=32, json_schema_extra={"enum": [a.value for a in AnswerPath]})
    ] = None,
    feedback: Annotated[
        str | None, Query(max_length=32, json_schema_extra={"enum": list(FEEDBACK_FILTERS)})
    ] = None,
    since: Since = None,
    until: Until = None,
    cursor: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    """Logged runs the caller may browse (its tenant's for a backend's or a reviewer's key, its
    one user's for a user's key), newest first, as stored (PHI-scrubbed), with their feedback
    counts; filtered by agent, policy version, status, who answered (`answered_by`), feedback
    (any, none, thumbs_up, thumbs_down, reviewed, unreviewed) and time; pages by `cursor`. A
    page reads at most 1,000 runs: a rare filter answers a short page and a `next_cursor`."""
    if agent is not None:
        services.runtime.spec(agent)
    keep = RunFilter(agent, version, status, answered_by, feedback)
    return await runs_page(
        services.redis,
        caller.reads,
        keep,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
        shards=services.settings.shards,
    )


@router.get("/v1/runs/{trajectory_id}", responses=errors(401, 404, 422, 503))
async def get_run(
    trajectory_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,128}$")],
    services: ServicesDep,
    caller: CallerDep,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """One run whole, as stored (PHI-scrubbed): its steps (model calls with the tool calls they
    asked for, tool results), the guard's verdict (`answered_by`, the model's own answer when
    replaced, the guard's and verifier's findings) and its feedback."""
    return await run_detail(
        services.redis, caller.reads, trajectory_id, cursor, services.settings.shards
    )


@router.get(
    "/v1/feedback/export",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-ndjson": {}}, "description": "JSON lines."},
        **errors(401, 404, 422, 503),
    },
)
async def export_feedback(
    services: ServicesDep,
    caller: CallerDep,
    agent: AgentName = None,
    since: Since = None,
    rated_only: bool = False,
) -> StreamingResponse:
    """Every logged run of the caller's tenant (or its one user) since `since` with its
    feedback, one JSON object per line:
    `{"trajectory": <TrajectoryEvent>, "feedback": [<FeedbackEvent>, ...]}`."""
    if agent is not None:
        services.runtime.spec(agent)
    lines = export_jsonl(
        services.redis,
        sees=caller.sees,
        agent=agent,
        since=since,
        rated_only=rated_only,
        shards=services.settings.shards,
    )
    first = await anext(lines, None)  # a bad `since` is a 422 here, before the 200 starts

    async def body():
        if first is not None:
            yield first
            async for line in lines:
                yield line

    return StreamingResponse(body(), media_type="application/x-ndjson")


def _message(m: AnyMessage) -> ThreadMessage | None:
    content = m.content if isinstance(m.content, str) else str(m.content)
    if isinstance(m, HumanMessage):
        return ThreadMessage(role="user", content=content)
    if isinstance(m, ToolMessage):
        return ThreadMessage(role="tool", content=content, tool_call_id=m.tool_call_id)
    if isinstance(m, AIMessage):
        calls: list[dict[str, Any]] = m.additional_kwargs.get("tool_calls") or []
        return ThreadMessage(role="assistant", content=content, tool_calls=calls)
    return None
