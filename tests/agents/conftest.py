"""Fixtures for agent tests: the scripted model endpoint and an asyncio Redis client."""

from tests.fakes.fixtures import aredis, llm  # noqa: F401
