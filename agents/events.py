"""Every event arloop writes to Redis: one schema module, frozen models, idempotent by event_id."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1

# Redis names: the public contract between the serving side and the learner.
# A Redis Cluster runs a multi-key script or transaction only on keys of one slot, so the keys
# written together share a hash tag (`{...}`: the only part of the name the cluster hashes):
# the registry, the learner's lease and fence under `{policy}`; a feedback's replay marker,
# rate windows and named-score count under the feedback stream's own name, `{arloop:feedback}`.
# On a plain Redis a tag is part of the name and nothing more (docs/deploying.md, "Redis Cluster").
STREAM_TRAJECTORIES = "arloop:trajectories"
STREAM_FEEDBACK = "arloop:feedback"
STREAM_DEAD = "arloop:dead"
STREAM_EVAL_TRAJECTORIES = "arloop:eval:trajectories"  # gate eval runs: audited, never trained on
EVAL_CACHE_PREFIX = "arloop:eval:cache:"  # + version: its eval outcomes by form, task, seed
POLICY_TAG = "{policy}"  # the registry's slot: every registry write checks the learner's fence
POLICY_PREFIX = f"arloop:policy:{POLICY_TAG}"
STREAM_POLICY = f"{POLICY_PREFIX}:events"
POLICY_ALIASES = f"{POLICY_PREFIX}:aliases"  # hash: alias -> version
POLICY_VERSIONS = f"{POLICY_PREFIX}:versions"  # sorted set: version -> creation time
POLICY_CHANNEL = "arloop:policy:changed"  # pub/sub: a version or alias moved
LEARNER_GROUP = "learner"
LEARNER_LEASE = f"arloop:learner:{POLICY_TAG}:lease"  # "<fencing token>|<holder>", TTL
LEARNER_FENCE = f"arloop:learner:{POLICY_TAG}:fence"  # counter behind the fencing tokens
LEARNER_STATUS = "arloop:learner:status"  # JSON the learner rewrites: streams, last round, canary
SERVING_PREFIX = "arloop:serving"  # one key per policy server process: what it serves (TTL)
# Serving-side keys (agent API): thread state and records, long-term memory, feedback guards.
CHECKPOINT_PREFIX = "arloop:lg"  # LangGraph thread checkpoints (langgraph-checkpoint-plainredis)
THREAD_PREFIX = "arloop:thread"  # hash per thread: owner, agent, policy arm; plus a run lock
MEMORY_PREFIX = "arloop:memory"  # lists per user and task kind: reflections, facts
FEEDBACK_TAG = "{arloop:feedback}"  # the feedback stream's slot, for what its intake writes with it
SEEN_BASE = "arloop:feedback:seen"  # + `:{shard's tag}`: replay markers per run and kind
SCORES_BASE = "arloop:feedback:scores"  # + `:{shard's tag}`: named scores taken per run
FEEDBACK_SEEN_PREFIX = f"{SEEN_BASE}:{FEEDBACK_TAG}"  # one shard's replay markers
FEEDBACK_SCORES_PREFIX = f"{SCORES_BASE}:{FEEDBACK_TAG}"  # one shard's named-score counts
RATE_PREFIX = "arloop:rate"  # per-user rate-limit windows
CASE_KEY = "arloop.case"  # trajectory metadata: the case a reply to a follow-up question joined
HEALTH_KEY = "arloop:health:agents"  # the agent API's /healthz writes it: does Redis take writes?
FORGET_REQUESTS = "arloop:forget"  # hash: stored user id -> when its erasure was asked
LEGACY_KEYS = {  # before the hash tags (0.x): `learner.policy.registry.migrate_legacy_keys`
    "arloop:policy:aliases": POLICY_ALIASES,
    "arloop:policy:versions": POLICY_VERSIONS,
    "arloop:policy:events": STREAM_POLICY,
    "arloop:policy:seq": f"{POLICY_PREFIX}:seq",
    "arloop:learner:fence": LEARNER_FENCE,
    "arloop:learner:lease": LEARNER_LEASE,
}
LEGACY_VERSION_PREFIX = "arloop:policy:v:"  # + version: a registry hash before the hash tags
LEGACY_SEEN_PREFIX = SEEN_BASE  # replay markers before the hash tags (TTL)
STREAM_SHARDS_KEY = "arloop:streams:shards"  # how many shards the streams have: set once, checked
CLUSTER_SLOTS = 16384
MAX_STREAM_SHARDS = 64


def hash_tag(name: str) -> str:
    """The part of a key name Redis Cluster hashes to pick its slot (its `{tag}`, else all of it)."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start + 1 : end] if end > start + 1 else name


def in_slot_of(anchor: str, prefix: str, rest: str) -> str:
    """`prefix:{tag}:rest`, a key name in `anchor`'s cluster slot (ACL patterns on `prefix:*`
    still match it)."""
    tag = hash_tag(anchor)
    if "}" in tag:
        raise ValueError(f"{anchor!r} has a '}}' outside a hash tag: no key can share its slot")
    return f"{prefix}:{{{tag}}}:{rest}"


def is_cluster(client: Any) -> bool:
    """Whether `client` is redis-py's Redis Cluster client (sync or asyncio)."""
    return type(client).__module__ in ("redis.cluster", "redis.asyncio.cluster")


@dataclass(frozen=True)
class StreamShards:
    """How the trajectory and feedback streams are split: `count` shards, a run's shard chosen
    by a hash of its trajectory id, so a run, its feedback, that feedback's replay markers and
    its dead letters all go to the same shard.

    One shard is the streams' names before sharding (`arloop:trajectories`, `arloop:feedback`,
    `arloop:dead`, markers under `{arloop:feedback}`). With `count` > 1, shard k's streams are
    `arloop:trajectories:<k>.<j>`, `arloop:feedback:<k>.<j>` and `arloop:dead:<k>.<j>`, each the
    hash tag of its own keys, with `j` the first counter that puts the name's cluster slot in
    the k-th of `count` equal parts of the slot space: on a cluster whose masters hold equal
    slot ranges (what `redis-cli --cluster create` makes), up to one shard per master lands on
    a master of its own, and a shard's streams share their master (docs/deploying.md).
    """

    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_STREAM_SHARDS:
            raise ValueError(f"stream shards must be 1..{MAX_STREAM_SHARDS}; got {self.count}")

    def of(self, trajectory_id: str) -> int:
        """The shard of a run (and of all its feedback)."""
        if self.count == 1:
            return 0
        digest = hashlib.sha256(trajectory_id.encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big") % self.count

    def trajectories(self, shard: int) -> str:
        return _shard_name(STREAM_TRAJECTORIES, shard, self.count)

    def feedback(self, shard: int) -> str:
        return _shard_name(STREAM_FEEDBACK, shard, self.count)

    def dead(self, shard: int) -> str:
        return _shard_name(STREAM_DEAD, shard, self.count)

    def feedback_tag(self, shard: int) -> str:
        """`{...}`: the hash tag of shard `shard`'s replay markers and named-score counts."""
        return "{" + self.feedback(shard) + "}"

    def all_trajectories(self) -> tuple[str, ...]:
        return tuple(self.trajectories(k) for k in range(self.count))

    def all_feedback(self) -> tuple[str, ...]:
        return tuple(self.feedback(k) for k in range(self.count))

    def all_dead(self) -> tuple[str, ...]:
        return tuple(self.dead(k) for k in range(self.count))

    def shard_of_stream(self, stream: str) -> int:
        """Which shard a trajectory, feedback or dead-letter stream name belongs to."""
        for k in range(self.count):
            if stream in (self.trajectories(k), self.feedback(k), self.dead(k)):
                return k
        raise ValueError(f"{stream!r} is not a stream of {self.count} shard(s)")


ONE_SHARD = StreamShards()  # the streams unsharded: their names before sharding


def _shard_name(base: str, shard: int, count: int) -> str:
    if not 0 <= shard < count:
        raise ValueError(f"shard {shard} out of 0..{count - 1}")
    return base if count == 1 else _spread_name(base, shard, count)


@cache
def _spread_name(base: str, shard: int, count: int) -> str:
    from redis.crc import key_slot  # CRC16 mod 16384, as the cluster hashes a key

    low, high = shard * CLUSTER_SLOTS // count, (shard + 1) * CLUSTER_SLOTS // count
    for j in range(1_000_000):
        name = f"{base}:{shard}.{j}"
        if low <= key_slot(name.encode()) < high:
            return name
    raise AssertionError(f"no name for shard {shard} of {count}")  # 1/64 of slots: never


def check_shards(stored: bytes | str | None, shards: StreamShards) -> str | None:
    """Why a process configured with `shards` must not run on streams laid out as `stored`
    (the value of `STREAM_SHARDS_KEY`, None when unset); None when it may."""
    recorded = None if stored is None else as_text(stored)[:20]
    if recorded is None or recorded == str(shards.count):
        return None
    return (
        f"ARLOOP_STREAM_SHARDS={shards.count}, but this Redis's streams are split into "
        f"{recorded!r} shard(s) (key {STREAM_SHARDS_KEY}): a run's feedback would go to "
        "another shard than its replay markers. Set ARLOOP_STREAM_SHARDS="
        f"{recorded} on every process, or change the count as docs/deploying.md "
        '("Sharded streams") says: stop the agent APIs, let the learner catch up, then '
        f"DEL {STREAM_SHARDS_KEY} and start everything with the new count"
    )


def policy_version_key(version: str) -> str:
    """The registry hash of one version (fields JSON-encoded, `learner.policy.lifecycle`)."""
    return f"{POLICY_PREFIX}:v:{version}"


def serving_key(instance: str) -> str:
    """A policy server process's heartbeat: the versions it serves and their checkpoint digests."""
    return f"{SERVING_PREFIX}:{instance}"


def vllm_routes_key(route_name: str) -> str:
    """`arloop serve vllm-sync`'s record for one vLLM (a heartbeat-shaped serving report plus
    alias -> adapter routes), read by the agents that call `hosted_vllm/<route_name>`."""
    return serving_key(f"vllm:{route_name}")


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


def as_text(value: bytes | str) -> str:
    """A Redis field as text: clients made without `decode_responses` give bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)
