"""Request and response bodies of the agent API (validated: bad input is a 4xx with a reason)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from agents.events import MAX_SCORE, SCORE_KEY_PATTERN
from deploy.agent_api.stream_merge import CURSOR

UserId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.@+-]{1,128}$")]
ThreadId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]
MAX_METADATA_KEYS = 16
MAX_METADATA_VALUE = 512
RESERVED_PREFIX = "arloop."  # keys the runtime itself writes


_SURROGATE = re.compile("[\ud800-\udfff]")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _valid_unicode(self) -> _Body:
        """JSON may carry lone surrogates (`"\\ud800"`); no text we store or answer can."""
        for name in type(self).model_fields:
            where = _surrogate_at(getattr(self, name), name)
            if where is not None:
                raise ValueError(
                    f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                    "send valid Unicode text"
                )
        return self


MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE)]


class RunRequest(_Body):
    """`POST /v1/agents/{agent}/runs`."""

    input: str = Field(min_length=1, description="The user's message.")
    user_id: UserId
    thread_id: ThreadId | None = Field(None, description="Continue this thread; new if unset.")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict,
        max_length=MAX_METADATA_KEYS,
        description=f"Up to {MAX_METADATA_KEYS} string pairs copied into the trajectory; keys "
        f"starting '{RESERVED_PREFIX}' are the runtime's own and refused.",
    )

    @field_validator("metadata")
    @classmethod
    def _not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.startswith(RESERVED_PREFIX):
                raise ValueError(f"metadata key {key[:70]!r}: 1-64 characters, not 'arloop.*'")
        return value


def _surrogate_at(value: Any, where: str) -> str | None:
    """The path of the first string (or key) in `value` holding a lone surrogate, else None."""
    if isinstance(value, str):
        return where if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _surrogate_at(key, f"{where} key") or _surrogate_at(item, f"{where}.{key}")
            if found is not None:
                return found.encode("utf-8", "backslashreplace").decode()
    return None


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


# Python's str.isspace() characters, spelt out so every regex engine agrees with `strip()`.
_NOT_SPACE = "[^\\t\\n\\x0b\\x0c\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
_VALUE_BY_KIND = {  # what agents.events.check_feedback_value accepts, per kind
    "thumbs": {"properties": {"value": {"enum": [1, -1]}}, "required": ["value"]},
    "rating": {"properties": {"value": {"type": "number", "minimum": 1, "maximum": 5}}},
    "outcome": {"properties": {"value": {"type": "number", "minimum": 0, "maximum": 1}}},
    "correction": {"properties": {"text": {"type": "string", "pattern": _NOT_SPACE}}},
    "score": {
        "properties": {
            "key": {"type": "string", "pattern": SCORE_KEY_PATTERN},
            "score": {"type": "number", "minimum": -MAX_SCORE, "maximum": MAX_SCORE},
            "value": {"type": "number", "minimum": -MAX_SCORE, "maximum": MAX_SCORE},
        },
        "required": ["key"],
        "anyOf": [  # the number as `score` (or `value`)
            {"required": [name], "properties": {name: {"type": "number"}}}
            for name in ("score", "value")
        ],
    },
}


def _value_fits_kind(schema: dict[str, Any]) -> None:
    """The schema says which value each kind takes (the intake checks it with a reason)."""
    named = _VALUE_BY_KIND["score"]
    schema["anyOf"] = [  # a kind, or a key alone: a named score
        {"required": ["kind"], "properties": {"kind": {"type": "string"}}},
        named,
    ]
    schema["allOf"] = [
        {
            "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
            "then": {
                "required": rule.get("required", list(rule["properties"])),
                **{k: v for k, v in rule.items() if k != "required"},
            },
        }
        for kind, rule in _VALUE_BY_KIND.items()
    ]
    for one, other, kind in (("value", "score", "number"), ("text", "comment", "string")):
        both = {
            "required": [one, other],
            "properties": {one: {"type": kind}, other: {"type": kind}},
        }
        schema["allOf"].append({"not": both})  # `value` or `score`, `text` or `comment`
    for name, kind in (("key", "string"), ("score", "number")):  # only on a named score
        given = {"required": [name], "properties": {name: {"type": kind}}}
        schema["allOf"].append(
            {"if": given, "then": {"properties": {"kind": {"enum": ["score", None]}}}}
        )


class FeedbackRequest(_Body):
    """`POST /v1/feedback`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_value_fits_kind)

    trajectory_id: str = Field(min_length=1, max_length=128)
    feedback_token: str | None = Field(None, max_length=2048)
    kind: str | None = Field(
        None,
        max_length=32,
        description="thumbs, rating, correction, outcome, or score (a named `key` with a "
        "`score`, as LangSmith and Langfuse take feedback: the kind when `key` is sent alone).",
        json_schema_extra={"enum": [*_VALUE_BY_KIND, None]},
    )
    value: float | None = Field(None, allow_inf_nan=False)
    text: str | None = Field(None, max_length=8000)
    user_id: UserId | None = None
    turn: int | None = Field(None, ge=0, le=100_000)
    # -- named scores (issue 17) ----------------------------------------------------------
    key: str | None = Field(
        None,
        max_length=64,
        pattern=SCORE_KEY_PATTERN,
        description="A named score's name, e.g. `helpfulness`.",
    )
    score: float | None = Field(
        None,
        allow_inf_nan=False,
        ge=-MAX_SCORE,
        le=MAX_SCORE,
        description="A named score's value (any scale: its agent's pack reads it as a reward).",
    )
    comment: str | None = Field(
        None, max_length=8000, description="A comment on the run (stored PHI-scrubbed)."
    )

    @model_validator(mode="after")
    def _one_name_per_field(self) -> FeedbackRequest:
        """`score` is the value and `comment` the text of the feedback: not both names; a `key`
        without a kind is a named score."""
        if self.kind is None:
            if self.key is None:
                raise ValueError(
                    "kind is required (thumbs, rating, correction, outcome), or send a named "
                    'score: {"key": "helpfulness", "score": 0.8, "comment": "..."}'
                )
            self.kind = "score"
        if self.kind != "score" and (self.key is not None or self.score is not None):
            raise ValueError(
                f"key and score make a named score; {self.kind} feedback takes `value`"
            )
        if self.score is not None and self.value is not None:
            raise ValueError("send a named score's number as `score` or `value`, not both")
        if self.comment is not None and self.text is not None:
            raise ValueError("send the text as `comment` or `text`, not both")
        return self


class ReviewRequest(_Body):
    """`POST /v1/review/{trajectory_id}`: a reviewer's verdict on one run."""

    score: float = Field(
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="How right the answer returned was: 1 right, 0 wrong (0.5: partly).",
    )
    text: str | None = Field(
        None,
        max_length=8000,
        description="The right answer (a triage level, a number) or a corrected reply; the "
        "learner reads the answer it states as a label (stored PHI-scrubbed).",
    )
    cursor: str | None = Field(
        None,
        max_length=48,
        pattern=CURSOR,
        description="The run's list item's `cursor` (finds it at once).",
    )


class FeedbackAccepted(BaseModel):
    event_id: str


class AgentList(BaseModel):
    agents: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Every error answer: what was wrong and what to do."""

    detail: str


class FieldError(BaseModel):
    """One field that did not validate (pydantic's error, with its input made safe to send)."""

    type: str
    loc: list[str | int]
    msg: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class InvalidRequest(BaseModel):
    """A 422: the reason as text, or the fields that did not validate."""

    detail: str | list[FieldError]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route can answer."""
    return {
        s: {"model": InvalidRequest if s == 422 else ErrorBody, "description": ERROR_MEANINGS[s]}
        for s in statuses
    }


ERROR_MEANINGS = {
    400: "The body is not JSON this API can read: invalid UTF-8, nested too deeply, or an "
    "integer of more than 4300 digits.",
    401: "Missing or unknown API key (`Authorization: Bearer <key>`), or an invalid "
    "feedback token.",
    403: "The thread or token belongs to another user.",
    404: "No such agent, or no such thread for this user.",
    409: "The thread is busy or belongs to another agent; feedback already given.",
    413: "The request body or the input is over its limit.",
    422: "A parameter or body field is invalid; the detail names it.",
    429: "Over the per-user rate limit; `Retry-After` says when to retry.",
    502: "The policy endpoint failed.",
    500: "Redis refused a command (a fault on our side, in the operator's logs).",
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


class ErasedView(BaseModel):
    """`DELETE /v1/users/{user_id}`: what was erased."""

    user_id: str
    threads: int
    """Threads removed, with their checkpoints."""
    memories: int
    """Long-term memory lists removed."""
    events: int
    """Runs and feedback removed from the streams (the learner erases its own copy)."""


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
    key: str | None = Field(None, description="A named score's name (kind `score`).")
    reward: float | None = Field(
        None, description="A named score as a reward, by its pack's rule (None: not learned)."
    )


class FeedbackPage(BaseModel):
    """`GET /v1/feedback`: a bounded page, oldest first."""

    items: list[FeedbackItem]
    next_cursor: str | None = Field(
        description="Read on from here (`cursor=`); null when the stream's end was reached."
    )
