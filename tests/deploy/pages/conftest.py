"""Fixtures of the page tests: a headless browser, the agent API, the scripted model."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.browser import browser, page  # noqa: F401
from tests.fakes.fixtures import aredis, llm  # noqa: F401
