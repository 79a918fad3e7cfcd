"""Routes that read history back: a thread's messages, feedback pages, the JSONL export."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from pydantic import WithJsonSchema

from agents.errors import ArloopError
from agents.events import FeedbackKind
from deploy.agent_api.deps import CallerDep, ServicesDep
from deploy.agent_api.feedback_log import CURSOR, SECONDS, export_jsonl, feedback_page
from deploy.agent_api.schemas import (
    FeedbackPage,
    ThreadId,
    ThreadMessage,
    ThreadView,
    UserId,
    errors,
)

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
        services.redis, sees=caller.sees, agent=agent, since=since, rated_only=rated_only
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
