"""Fixtures for deploy tests: the scripted model endpoint, agent API instances, async Redis."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import aredis, llm  # noqa: F401
