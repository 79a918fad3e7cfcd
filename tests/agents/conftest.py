"""Fixtures for agent tests: the scripted model endpoint and an asyncio Redis client."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import aredis, llm  # noqa: F401
