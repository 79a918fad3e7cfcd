"""Request and response bodies of the agent API (validated: bad input is a 4xx with a reason)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

UserId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.@+-]{1,128}$")]
ThreadId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
MAX_METADATA_KEYS = 16
MAX_METADATA_VALUE = 512
RESERVED_PREFIX = "arloop."  # keys the runtime itself writes


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunRequest(_Body):
    """`POST /v1/agents/{agent}/runs`."""

    input: str = Field(min_length=1, description="The user's message.")
    user_id: UserId
    thread_id: ThreadId | None = Field(None, description="Continue this thread; new if unset.")
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description=f"Up to {MAX_METADATA_KEYS} string pairs copied into the trajectory.",
    )

    @field_validator("metadata")
    @classmethod
    def _small_and_plain(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} metadata keys")
        for key, item in value.items():
            if not 1 <= len(key) <= 64 or key.startswith(RESERVED_PREFIX):
                raise ValueError(f"metadata key {key[:70]!r}: 1-64 characters, not 'arloop.*'")
            if len(item) > MAX_METADATA_VALUE:
                raise ValueError(f"metadata value of {key!r} is over {MAX_METADATA_VALUE} chars")
        return value


class RunResponse(BaseModel):
    trajectory_id: str
    thread_id: str
    output: str
    policy_version: str
    feedback_token: str
    status: str = Field(
        description="ok; step_budget (stopped before a final answer); escalated (the pack's "
        "red-flag rules answered); fallback (the model's answer failed its checks and was "
        "replaced by the pack's safe fallback)."
    )
    answered_by: str = Field(
        "model", description="Who wrote `output`: model, envelope (red-flag rules) or fallback."
    )
    tools: list[str] = Field(
        default_factory=list, description="The tools the run called, in order."
    )
    disclaimer: str | None = Field(None, description="The agent's disclaimer, shown with answers.")
    escalation: str | None = Field(
        None,
        description="A notice the pack's rules raise whatever the model wrote (e.g. call "
        "emergency services now); show it prominently.",
    )


class FeedbackRequest(_Body):
    """`POST /v1/feedback`."""

    trajectory_id: str = Field(min_length=1, max_length=128)
    feedback_token: str | None = Field(None, max_length=2048)
    kind: str = Field(max_length=32, description="thumbs, rating, correction or outcome.")
    value: float | None = Field(None, allow_inf_nan=False)
    text: str | None = Field(None, max_length=8000)
    user_id: UserId | None = None
    turn: int | None = Field(None, ge=0, le=100_000)


class FeedbackAccepted(BaseModel):
    event_id: str


class AgentList(BaseModel):
    agents: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Every error answer: what was wrong and what to do."""

    detail: str


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route can answer."""
    return {s: {"model": ErrorBody, "description": ERROR_MEANINGS[s]} for s in statuses}


ERROR_MEANINGS = {
    401: "Missing or unknown API key (`Authorization: Bearer <key>`), or an invalid "
    "feedback token.",
    403: "The thread or token belongs to another user.",
    404: "No such agent, or no such thread for this user.",
    409: "The thread is busy or belongs to another agent; feedback already given.",
    413: "The request body or the input is over its limit.",
    422: "A parameter or body field is invalid; the detail names it.",
    429: "Over the per-user rate limit; `Retry-After` says when to retry.",
    502: "The policy endpoint failed.",
    503: "Redis is unavailable; retry shortly.",
    504: "The policy endpoint timed out.",
}


class ThreadMessage(BaseModel):
    """One message of a thread, as the model saw it."""

    role: str = Field(description="user, assistant or tool")
    content: str
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: str | None = None


class ThreadView(BaseModel):
    """`GET /v1/threads/{thread_id}`."""

    thread_id: str
    agent: str
    user_id: str
    created_at: float | None = None
    messages: list[ThreadMessage]


class FeedbackItem(BaseModel):
    """One accepted piece of feedback, as the feedback stream holds it."""

    cursor: str = Field(description="Its stream entry id: pass it as `cursor` to read on.")
    event_id: str
    trajectory_id: str
    agent: str | None
    user_id: str
    kind: str
    value: float | None
    text: str | None
    policy_version: str
    turn: int | None
    created_at: float


class FeedbackPage(BaseModel):
    """`GET /v1/feedback`: a bounded page, oldest first."""

    items: list[FeedbackItem]
    next_cursor: str | None = Field(
        description="Read on from here (`cursor=`); null when the stream's end was reached."
    )
