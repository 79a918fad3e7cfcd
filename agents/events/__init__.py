"""Every event arloop writes to Redis: one schema module, frozen models, idempotent by event_id.

The Redis names the events live under are in `agents.events.keys`, re-exported here."""

from __future__ import annotations

import json
import re
import time
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.events.keys import *  # noqa: F403 (the Redis names: `agents.events` re-exports them)
from agents.events.keys import CASE_KEY, as_text

SCHEMA_VERSION = 1


def new_id(prefix: str) -> str:
    """A sortable-enough unique id with a readable prefix."""
    return f"{prefix}_{uuid.uuid4().hex}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Event(_Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str
    created_at: float = Field(default_factory=time.time)


class ToolCallRequest(_Frozen):
    """A tool call as the model asked for it (arguments are the raw JSON text it wrote)."""

    id: str
    name: str
    arguments: str


class ModelStep(_Frozen):
    """One call of the policy: what went in, what came out, and the exact tokens when known."""

    kind: Literal["model"] = "model"
    index: int
    messages: list[dict[str, Any]]
    tool_names: list[str] = []
    output: str | None
    tool_calls: list[ToolCallRequest] = []
    finish_reason: str | None = None
    model: str
    policy_version: str
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None  # one per completion token, behaviour policy
    # What computed the logprobs, as the policy server says (`transformers-fp32`, `llamacpp-f16`);
    # None: not said (another endpoint, or an event from before). The learner recomputes the
    # logprobs of an engine whose numerics are not its own (learner/behaviour.py).
    engine: str | None = None
    node: str | None = None
    """The graph node that made the call, as a team's agent said (`X-Arloop-Node`, from
    LangGraph's run metadata: `agents.graph_nodes`); None: not said."""
    latency_ms: float


class ToolStep(_Frozen):
    """One sandboxed tool call and the observation the model saw."""

    kind: Literal["tool"] = "tool"
    index: int
    call_id: str
    name: str
    arguments: dict[str, Any] | str
    output: str
    error: str | None = None
    truncated: bool = False
    latency_ms: float


StepEvent = Annotated[ModelStep | ToolStep, Field(discriminator="kind")]


class RunStatus(StrEnum):
    OK = "ok"
    STEP_BUDGET = "step_budget"  # stopped by the step budget before a final answer
    CANCELLED = "cancelled"  # the client left mid-run (a stream): logged, never trained on
    ESCALATED = "escalated"  # the pack's red-flag rules answered (see AnswerPath.ENVELOPE)
    FALLBACK = "fallback"  # the answer failed its checks: the safe fallback was returned


class AnswerPath(StrEnum):
    """Who wrote the answer a run returned (the learner trains only on the model's own)."""

    MODEL = "model"  # the model's final answer, as it wrote it
    ENVELOPE = "envelope"  # a pack's red-flag escalation; the model's text in it only if it passed
    FALLBACK = "fallback"  # the safe fallback: the model's last answer failed its checks


class TrajectoryEvent(_Event):
    """One finished agent run; event_id is the trajectory id."""

    thread_id: str
    agent: str
    task_kind: str | None = None
    user_id: str
    input: str
    output: str
    policy_version: str
    steps: list[StepEvent]
    status: RunStatus = RunStatus.OK
    started_at: float
    finished_at: float
    metadata: dict[str, str] = {}
    answered_by: AnswerPath = AnswerPath.MODEL
    """Which path wrote `output`: feedback on an envelope or fallback answer judges text the
    model did not write, so the learner does not credit it to the model's steps."""
    model_output: str | None = None
    """The model's own final answer when another path replaced it (None: `output` is it)."""

    @property
    def trajectory_id(self) -> str:
        return self.event_id

    @property
    def case(self) -> str:
        """What the run answered: `input`, after the case a follow-up question left pending
        on the thread (`metadata[CASE_KEY]`) when `input` is the user's reply to it."""
        return self.metadata.get(CASE_KEY) or self.input

    @property
    def model_answer(self) -> str:
        """The model's own final answer, whoever answered the user (what a gate judges)."""
        return self.output if self.model_output is None else self.model_output

    @property
    def model_steps(self) -> list[ModelStep]:
        return [s for s in self.steps if isinstance(s, ModelStep)]

    @property
    def tool_steps(self) -> list[ToolStep]:
        return [s for s in self.steps if isinstance(s, ToolStep)]


class FeedbackKind(StrEnum):
    THUMBS = "thumbs"  # value +1 (up) or -1 (down)
    RATING = "rating"  # value 1..5
    CORRECTION = "correction"  # text: what the answer should have been; value unused
    OUTCOME = "outcome"  # value 0..1: did the user's task succeed
    VERIFIER = "verifier"  # value 0..1: an automatic check of the answer
    SCORE = "score"  # a named score (`key`, as LangSmith and Langfuse take it): any finite value,
    # text an optional comment; `reward` is its pack's reading of it (`Pack.score_reward`)
    REVIEW = "review"  # a reviewer's verdict from the annotation queue (`source` "review"):
    # value 0..1 scores the answer returned; text (optional) states the right answer or a
    # corrected reply. Not a user's to send: a reviewer's key posts it to /v1/review/{id}


SCORE_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}$"
"""A named score's key: `helpfulness`, `correctness/v2`, ... (1-64 characters)."""
MAX_SCORE = 1e9
"""Largest |value| a named score takes (its scale is the team's; nothing sane is larger)."""


def check_feedback_value(kind: FeedbackKind, value: float | None, text: str | None) -> None:
    """Raise ValueError naming the allowed range when a feedback value does not fit its kind."""
    if kind is FeedbackKind.THUMBS and value not in (1, -1):
        raise ValueError("thumbs takes value 1 (up) or -1 (down)")
    if kind is FeedbackKind.RATING and (value is None or not 1 <= value <= 5):
        raise ValueError("rating takes a value from 1 to 5")
    if kind in (FeedbackKind.OUTCOME, FeedbackKind.VERIFIER, FeedbackKind.REVIEW) and (
        value is None or not 0 <= value <= 1
    ):
        raise ValueError(f"{kind.value} takes a value from 0 to 1")
    if kind is FeedbackKind.CORRECTION and not (text and text.strip()):
        raise ValueError("correction needs a non-empty text")
    if kind is FeedbackKind.SCORE and (value is None or not abs(value) <= MAX_SCORE):
        raise ValueError(
            f"a named score takes a finite number from {-MAX_SCORE:g} to {MAX_SCORE:g}"
        )


def kind_reward(kind: FeedbackKind, value: float | None) -> float | None:
    """A feedback's reward in [-1, 1] by its kind: thumbs is its value (+1 / -1); a rating r in
    1..5 is (r - 3) / 2; an outcome, verifier result or review score v in 0..1 is 2v - 1; a
    correction has none (it is a label or a preference pair); a named score is its pack's to read."""
    if kind is FeedbackKind.THUMBS:
        return float(value)  # type: ignore[arg-type]
    if kind is FeedbackKind.RATING:
        return (float(value) - 3.0) / 2.0  # type: ignore[arg-type]
    if kind in (FeedbackKind.OUTCOME, FeedbackKind.VERIFIER, FeedbackKind.REVIEW):
        return 2.0 * float(value) - 1.0  # type: ignore[arg-type]
    return None


def check_score_key(kind: FeedbackKind, key: str | None) -> None:
    """Raise ValueError unless a named score has a valid `key` and other kinds have none."""
    if kind is not FeedbackKind.SCORE:
        if key is not None:
            raise ValueError(f"key names a score; {kind.value} feedback takes none")
        return
    if key is None or not re.fullmatch(SCORE_KEY_PATTERN, key):
        raise ValueError(
            "a named score needs a key of 1-64 letters, digits or _ . : / - "
            "(starting with a letter or digit), e.g. 'helpfulness'"
        )


def feedback_slot(kind: FeedbackKind, key: str | None) -> str:
    """What one piece of feedback occupies on a trajectory: its kind, or `score:<key>` (each
    named score is its own): accepted once per trajectory, the latest word per sender."""
    return f"score:{key}" if kind is FeedbackKind.SCORE else kind.value


class FeedbackEvent(_Event):
    """A piece of feedback on one trajectory (optionally on one turn of it)."""

    trajectory_id: str
    user_id: str
    kind: FeedbackKind
    value: float | None = None
    text: str | None = None
    policy_version: str
    turn: int | None = None  # index of the model step it is about, when per turn
    source: Literal["user", "verifier", "system", "review"] = "user"
    """Who judged: a user, a verifier, the system, or a reviewer (kind `review`, whose
    `user_id` is the reviewer's stored id, not the run's user's)."""
    agent: str | None = None  # the agent that ran (from the token; None on older tokens)
    credential: str | None = None  # the API key's name it came with (None: older events)
    key: str | None = None  # a named score's name (kind `score` only)
    reward: float | None = Field(None, ge=-1.0, le=1.0, allow_inf_nan=False)
    """What this feedback is worth to the learner in [-1, 1], decided once, when it arrives:
    by its kind (`kind_reward`: filled in here), or for a named score by its pack's rule (set
    by the intake). None: not learned from as a reward (a correction, an unread score). The
    learner reads this field and maps nothing itself."""

    @model_validator(mode="after")
    def _value_fits_kind(self) -> FeedbackEvent:
        check_feedback_value(self.kind, self.value, self.text)
        check_score_key(self.kind, self.key)
        if (self.kind is FeedbackKind.REVIEW) != (self.source == "review"):
            raise ValueError("a review is kind 'review' from source 'review', and only it")
        if self.kind is FeedbackKind.SCORE:
            return self
        by_kind = kind_reward(self.kind, self.value)
        if self.reward is not None and self.reward != by_kind:
            raise ValueError(
                f"{self.kind.value} {self.value} is worth {by_kind} by its kind, not {self.reward}"
            )
        object.__setattr__(self, "reward", by_kind)  # frozen: set once, in validation
        return self

    @property
    def slot(self) -> str:
        """Its kind, or `score:<key>` (see `feedback_slot`)."""
        return feedback_slot(self.kind, self.key)


class PolicyPublished(_Event):
    """A new policy version exists in the registry (not yet necessarily serving)."""

    version: str
    parent: str | None
    base_model: str
    checkpoint_uri: str
    checkpoint_kind: Literal["base", "lora", "full"]
    metrics: dict[str, float] = {}
    trained_events: int = 0
    eval_report: dict[str, Any] | None = None


class PolicyAliasMoved(_Event):
    """An alias (champion, candidate) now points at another version; why, and who moved it."""

    alias: str
    version: str | None
    previous: str | None
    reason: str
    actor: str


class PolicyRolledBack(_Event):
    """Serving went back from one version to an earlier one."""

    from_version: str
    to_version: str
    reason: str
    actor: str


class PolicyRejected(_Event):
    """The eval gate refused a candidate; failed names the guards or tests that fired."""

    version: str
    failed: list[str]
    reason: str


class RegistryRewound(_Event):
    """The registry lost versions a learner had committed and registered (Redis restored from
    an older snapshot, or failed over to a lagging replica): serving went back to `champion`
    without a move, and the lost versions' events are trainable again."""

    lost_versions: list[str]
    champion: str | None
    retrainable_events: int
    reason: str
    actor: str


Event = (
    TrajectoryEvent
    | FeedbackEvent
    | PolicyPublished
    | PolicyAliasMoved
    | PolicyRolledBack
    | PolicyRejected
    | RegistryRewound
)
_TYPES: dict[str, type[_Event]] = {
    cls.__name__: cls
    for cls in (
        TrajectoryEvent,
        FeedbackEvent,
        PolicyPublished,
        PolicyAliasMoved,
        PolicyRolledBack,
        PolicyRejected,
        RegistryRewound,
    )
}


class EventDecodeError(ValueError):
    """A stream entry that is not a valid arloop event (goes to the dead-letter stream)."""


def encode(event: _Event) -> dict[str, str]:
    """Stream fields for XADD: the type, the schema version and the JSON body."""
    return {
        "type": type(event).__name__,
        "schema_version": str(event.schema_version),
        "event_id": event.event_id,
        "data": event.model_dump_json(),
    }


def decode(fields: dict[bytes | str, bytes | str]) -> Event:
    """Parse XREAD fields back into the event; EventDecodeError says what is wrong."""
    f = {as_text(k): as_text(v) for k, v in fields.items()}
    cls = _TYPES.get(f.get("type", ""))
    if cls is None:
        raise EventDecodeError(f"unknown event type {f.get('type')!r}")
    if f.get("schema_version") != str(SCHEMA_VERSION):
        raise EventDecodeError(f"unsupported schema_version {f.get('schema_version')!r}")
    try:
        return cls.model_validate(json.loads(f.get("data", "")))  # type: ignore[return-value]
    except (ValidationError, json.JSONDecodeError) as exc:
        raise EventDecodeError(f"{cls.__name__} does not parse: {exc}") from exc
