"""The fault-and-abuse suite: each defect found by probing as an attacker or as a failing
machine, rerun against real processes on loopback, bounded in count and time."""

from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import aredis, llm  # noqa: F401
