"""Fixtures for the docs' runnable examples: the agent API over real HTTP on a scripted model."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import llm  # noqa: F401
