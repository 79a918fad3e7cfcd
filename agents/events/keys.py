"""Where events live in Redis: every key and stream name, the hash tags that put keys written
together in one cluster slot, and the streams' shards. Import it as `agents.events`, which
re-exports every name here."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = [  # what `agents.events` re-exports
    "CASE_KEY",
    "CHECKPOINT_PREFIX",
    "CLUSTER_SLOTS",
    "EVAL_CACHE_PREFIX",
    "FEEDBACK_SCORES_PREFIX",
    "FEEDBACK_SEEN_PREFIX",
    "FEEDBACK_TAG",
    "FORGET_REQUESTS",
    "HEALTH_KEY",
    "LEARNER_FENCE",
    "LEARNER_GROUP",
    "LEARNER_LEASE",
    "LEARNER_STATUS",
    "LEGACY_KEYS",
    "LEGACY_SEEN_PREFIX",
    "LEGACY_VERSION_PREFIX",
    "MAX_STREAM_SHARDS",
    "MEMORY_PREFIX",
    "ONE_SHARD",
    "POLICY_ALIASES",
    "POLICY_CHANNEL",
    "POLICY_PREFIX",
    "POLICY_TAG",
    "POLICY_VERSIONS",
    "RATE_PREFIX",
    "SCORES_BASE",
    "SEEN_BASE",
    "SERVING_PREFIX",
    "STREAM_DEAD",
    "STREAM_EVAL_TRAJECTORIES",
    "STREAM_FEEDBACK",
    "STREAM_POLICY",
    "STREAM_SHARDS_KEY",
    "STREAM_TRAJECTORIES",
    "THREAD_PREFIX",
    "StreamShards",
    "as_text",
    "check_shards",
    "hash_tag",
    "in_slot_of",
    "is_cluster",
    "policy_version_key",
    "serving_key",
    "vllm_routes_key",
]

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


def as_text(value: bytes | str) -> str:
    """A Redis field as text: clients made without `decode_responses` give bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)
