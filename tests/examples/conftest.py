"""The examples' tests start the agent API as the deploy tests do."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import llm  # noqa: F401
