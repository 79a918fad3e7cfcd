"""Agents reach the versions a vLLM serves by adapter name.

With `ARLOOP_POLICY_MODEL=hosted_vllm/<route name>` (litellm's vLLM provider) and
`ARLOOP_POLICY_API_BASE` at vLLM's `/v1`, the policy client calls each version arm
(`champion`, `candidate`) by the name `arloop serve vllm-sync` loaded it under
(`hosted_vllm/v3-1a2b3c4d`), read from that process's record in Redis
(`agents.events.vllm_routes_key`), and records the version that served the call, since vLLM
answers with the adapter's name, not the version. Canary routing is unchanged: the thread's
arm picks the alias, the record picks the adapter.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from agents.events import ModelStep, vllm_routes_key
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from agents.threads import CHAMPION

PROVIDER = "hosted_vllm"


class AdapterRoutes:
    """alias -> vLLM model name, and model name -> version, from the sync's record (cached)."""

    def __init__(self, client: aioredis.Redis, route_name: str, ttl_s: float = 1.0) -> None:
        self.client, self.route_name, self.ttl_s = client, route_name, ttl_s
        self.routes: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self._read_at = float("-inf")

    async def refresh(self) -> None:
        """Read the record again when the cached one is older than `ttl_s`."""
        if time.monotonic() - self._read_at < self.ttl_s:
            return
        raw = await self.client.get(vllm_routes_key(self.route_name))
        record: dict[str, Any] = json.loads(raw) if raw else {}
        self.routes, self.versions = record.get("routes", {}), record.get("versions", {})
        self._read_at = time.monotonic()

    def model(self, arm: str | None) -> str | None:
        """The litellm model string for an arm (None: the sync has not routed it)."""
        name = self.routes.get(arm or CHAMPION)
        return f"{PROVIDER}/{name}" if name else None

    def version(self, model: str) -> str | None:
        """The version a model string served (None when unknown)."""
        return self.versions.get(model.removeprefix(f"{PROVIDER}/"))


class RoutedPolicyClient(PolicyClient):
    """A policy client whose version arms are vLLM adapters (see the module docstring)."""

    def __init__(self, config: PolicyConfig, routes: AdapterRoutes) -> None:
        super().__init__(config)
        self.routes = routes

    def model_for(self, arm: str | None) -> str:
        return self.routes.model(arm) or f"{self.config.model}@{arm or CHAMPION}"

    async def complete(self, messages, tools=(), *, arm: str | None = None, **kwargs) -> ModelStep:
        await self.routes.refresh()
        if self.routes.model(arm) is None:
            raise PolicyError(
                502,
                f"no vLLM adapter serves '{arm or CHAMPION}' yet: `arloop serve vllm-sync` "
                f"(ARLOOP_VLLM_ROUTE_NAME={self.routes.route_name}) has not routed it; "
                f"`arloop serve vllm-sync --check` says why",
            )
        # model_for runs before the call's first await: the route just read is the one used
        step = await super().complete(messages, tools, arm=arm, **kwargs)
        version = self.routes.version(step.model) or step.policy_version
        return step.model_copy(update={"policy_version": version, "engine": step.engine or "vllm"})


def policy_client(config: PolicyConfig, client: aioredis.Redis) -> PolicyClient:
    """The client for `config`: adapter routes when it names `hosted_vllm/<route>` and routes
    by version, the plain client otherwise."""
    provider, _, route = config.model.partition("/")
    if provider == PROVIDER and route and config.versioned:
        return RoutedPolicyClient(config, AdapterRoutes(client, route))
    return PolicyClient(config)
