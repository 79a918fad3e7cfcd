"""Start the agent API over real HTTP for tests: `start_api(**settings)` → an `Api` handle."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from agents.runtime import AgentSpec
from deploy.agent_api.app import create_app
from deploy.credentials import pseudonym, scoped_user
from deploy.settings import AgentApiSettings
from tests.fakes.fixtures import held_minute
from tests.fakes.servers import ServerThread
from tests.fakes.tools import Add, ExpectVerifier

API_KEY = "test-key"
SECRET = "test-secret-" + "x" * 32


def api_specs() -> list[AgentSpec]:
    """A ReAct tutor with `add`, and a Reflexion solver checked by a verifier."""
    return [
        AgentSpec(
            name="tutor",
            description="adds",
            system_prompt="You add.",
            tools=(Add(),),
            task_kind="tutoring",
        ),
        AgentSpec(
            name="solver",
            description="adds, checked",
            system_prompt="You add.",
            kind="reflexion",
            tools=(Add(),),
            verifier=ExpectVerifier("5"),
            task_kind="arithmetic",
        ),
    ]


@dataclass
class Api:
    server: ServerThread
    http: httpx.Client
    settings: AgentApiSettings
    app: FastAPI

    def hold_rate_window(self) -> None:
        """Stop the per-minute rate windows' clock halfway through the current minute: a test
        that counts requests up to a limit must not see the minute turn under it."""
        services = self.app.state.services
        services.limiter.clock = services.intake.clock = held_minute()

    def stored(self, user: str, tenant: str = "default") -> str:
        """The id arloop stores for `user` of `tenant` (its pseudonym under this API's key)."""
        return pseudonym(self.settings.pseudonym_key(), scoped_user(tenant, user))

    def run(self, text: str, user: str = "u1", agent: str = "tutor", **extra) -> httpx.Response:
        return self.http.post(
            f"/v1/agents/{agent}/runs", json={"input": text, "user_id": user, **extra}
        )

    def feedback(self, **body) -> httpx.Response:
        return self.http.post("/v1/feedback", json=body)

    def stop(self) -> None:
        self.http.close()
        self.server.stop()


@pytest.fixture
def start_api(redis_url, llm):
    """Start agent API instances (stopped after the test) on the test Redis and scripted model."""
    started: list[Api] = []

    def start(*, specs="test", scrubber=None, rng=None, extend=None, server=None, **overrides):
        """`specs=None` serves the configured packs; the default serves `api_specs()`.

        `extend(app)` runs before the server starts (a test route); `server` holds uvicorn
        options (see ServerThread); `overrides` are AgentApiSettings fields.
        """
        base = {
            "redis_url": redis_url,
            "policy_api_base": llm.base_url,
            "policy_api_key": "k",
            "policy_retries": 0,
            "policy_timeout_s": 5.0,
            "api_keys": [API_KEY],
            "secret_key": SECRET,
            "scrub_phi": False,
            "canary_share": 0.0,
        }
        settings = AgentApiSettings(_env_file=None, **(base | overrides))
        app = create_app(
            settings,
            specs=api_specs() if specs == "test" else specs,
            scrubber=scrubber,
            rng=rng or random.Random(0),
        )
        if extend is not None:
            extend(app)
        thread = ServerThread(app, **(server or {})).start()
        headers = {"Authorization": f"Bearer {API_KEY}"}
        http = httpx.Client(base_url=thread.url, headers=headers, timeout=30)
        api = Api(thread, http, settings, app)
        started.append(api)
        return api

    yield start
    for api in started:
        api.stop()
