"""Fixtures for agent and API tests; import them into a test module to use them."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from tests.fakes.scripted_llm import ScriptedLLM
from tests.fakes.servers import ServerThread

PATIENT_S = 60.0
"""Read timeout of the tests' asyncio Redis clients (see `aredis`)."""


def held_minute() -> Callable[[], float]:
    """A clock stopped halfway through the current minute, for a per-minute rate window: a test
    that counts requests up to a limit must not see the minute turn under it."""
    held = (time.time() // 60) * 60 + 30.0
    return lambda: held


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
