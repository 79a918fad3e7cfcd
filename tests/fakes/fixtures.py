"""Fixtures for agent and API tests; import them into a test module to use them."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from tests.fakes.scripted_llm import ScriptedLLM
from tests.fakes.servers import ServerThread

PATIENT_S = 60.0
"""Read timeout of the tests' asyncio Redis clients (see `aredis`)."""


@pytest.fixture
def llm():
    """A scripted OpenAI-compatible endpoint over real HTTP; `llm.base_url` ends in /v1."""
    fake = ScriptedLLM()
    with ServerThread(fake.app) as server:
        fake.base_url = f"{server.url}/v1"
        yield fake


@pytest.fixture
async def aredis(redis_url):
    """An asyncio Redis client on the test server (bytes replies, like the services use).

    Patient: redis-py's 5 s default read timeout counts time the event loop spends on other
    coroutines, which on a loaded machine is no sign of a Redis problem."""
    client = aioredis.from_url(redis_url, socket_timeout=PATIENT_S)
    yield client
    await client.aclose()
