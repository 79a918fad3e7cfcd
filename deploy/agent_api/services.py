"""What the agent API runs on: Redis, the agent runtime, feedback intake, limits, metrics."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis
import redis.asyncio as aioredis

from agents.feedback_intake import FeedbackIntake, ScoreRule
from agents.packs.base import Pack, default_score_reward
from agents.runtime import AgentRuntime, AgentSpec
from agents.trajectory_sink import Scrub
from deploy.agent_api.limits import RateLimiter
from deploy.agent_api.metrics import ApiMetrics
from deploy.agent_api.traffic import Tally
from deploy.settings import AgentApiSettings

if TYPE_CHECKING:
    from deploy.agent_api.external_runs import ExternalRuns


@dataclass
class Services:
    """One per app instance, built at startup (see `open_services`)."""

    settings: AgentApiSettings
    redis: aioredis.Redis
    runtime: AgentRuntime
    intake: FeedbackIntake
    limiter: RateLimiter
    metrics: ApiMetrics
    reader: redis.Redis | None = None
    """A blocking client for the dashboard's reads (run in a worker thread)."""
    user_key: bytes = b""
    """The key of the user ids' pseudonyms (`AgentApiSettings.pseudonym_key`)."""
    tally: Tally = field(default_factory=Tally)
    """Live traffic and report-card counts per tenant (those of `settings.api_keys`), read
    from the streams as the dashboard polls."""
    background: set[asyncio.Task] = field(default_factory=set)
    """Streamed runs in flight, held so a run whose client left still ends (and is logged)."""
    runs: ExternalRuns | None = None
    """The runs of other agents' `/v1/chat/completions` calls (`external_runs`)."""


def open_services(
    settings: AgentApiSettings,
    redis_url: str,
    specs: list[AgentSpec],
    metrics: ApiMetrics,
    scrub: Scrub | None = None,
    rng: random.Random | None = None,
    score_rule: ScoreRule | None = None,
) -> Services:
    """Connect to Redis (lazily: a Redis that is down now is a 503 later, not a crash)."""
    timeouts = {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": min(2.0, settings.redis_timeout_s),
    }
    client = settings.async_redis(redis_url, **timeouts)
    runtime = AgentRuntime.on_redis(
        client,
        specs,
        settings.policy_config(),
        canary_share=settings.canary_share,
        scrub=scrub,
        thread_ttl_s=settings.thread_ttl_s,
        lock_s=settings.thread_lock_s,
        memory_max_items=settings.memory_max_items,
        memory_ttl_s=settings.memory_ttl_s,
        stream_max_entries=settings.stream_max_entries,
        shards=settings.shards,
        rng=rng,
        durability=settings.checkpoint_durability,
    )
    intake = FeedbackIntake(
        client,
        settings.secret_key,
        settings.feedback_rate_per_minute,
        scrub,
        score_rule or score_rule_of([]),
        scores_per_run=settings.feedback_scores_per_run,
        max_entries=settings.stream_max_entries,
        shards=settings.shards,
    )
    from deploy.agent_api.external_runs import ExternalRuns  # it imports deps, which imports us

    runs = ExternalRuns(
        client,
        metrics=metrics,
        scrub=scrub,
        idle_s=settings.run_idle_s,
        canary_share=settings.canary_share if settings.policy_config().versions_routed else 0.0,
        lock_s=settings.thread_lock_s,
        max_entries=settings.stream_max_entries,
        shards=settings.shards,
        rng=rng,
        scrub_prompts=settings.chat_scrub_prompts,
    )
    reader = settings.redis_client(redis_url, **timeouts)
    return Services(
        settings,
        client,
        runtime,
        intake,
        RateLimiter(client),
        metrics,
        reader,
        user_key=settings.pseudonym_key(),
        tally=Tally({key.tenant for key in settings.api_keys}, shards=settings.shards),
        runs=runs,
    )


def score_rule_of(packs: list[Pack]) -> ScoreRule:
    """Named scores read by the `score_reward` of the pack that serves the agent (the default
    rule for an agent of no pack: `agents.packs.base.default_score_reward`)."""
    rules = {agent.name: pack.score_reward for pack in packs for agent in pack.agents}
    return lambda agent, key, score: rules.get(agent or "", default_score_reward)(key, score)


def phi_scrubber(settings: AgentApiSettings) -> Scrub | None:
    """`agents.pii`'s scrubber when ARLOOP_SCRUB_PHI is on (it is by default)."""
    if not settings.scrub_phi:
        return None
    try:
        from agents.pii import shared_scrubber
    except ImportError as exc:
        raise RuntimeError(
            f"ARLOOP_SCRUB_PHI is on but the PHI scrubber cannot load ({exc}); install "
            "arloop[serve] (presidio-analyzer) or set ARLOOP_SCRUB_PHI=false"
        ) from exc
    return shared_scrubber().scrub
