"""Fixtures for deploy tests: the scripted model endpoint, agent API instances, async Redis,
and one real `arloop demo --quick` run shared by the tests that read its data."""

import io
import threading

import pytest
import redis
from rich.console import Console

from deploy.demo.options import DemoOptions, quick
from deploy.demo.run import run_demo
from deploy.embedded_redis import start_redis
from tests.fakes.api import start_api  # noqa: F401
from tests.fakes.fixtures import aredis, llm  # noqa: F401


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    """(report, report folder, Redis client, console output) of one `arloop demo --quick`.

    After the demo has stopped its stack, its Redis is started again on the demo's data
    directory (append-only file): everything the demo wrote is there to read back.
    """
    root = tmp_path_factory.mktemp("demo")
    # 2 threads as given, not the cores idle when it starts: the tests' figures do not vary
    # with what else the machine runs
    opts = quick(
        DemoOptions(report_dir=root / "reports", data_dir=root / "data", seed=3, threads=2)
    )
    out = io.StringIO()
    done: dict = {}

    def demo() -> None:  # its own thread: the demo's asyncio.run needs a thread with no loop
        try:
            done["result"] = run_demo(opts, Console(file=out, width=160))
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the test
            done["error"] = exc

    thread = threading.Thread(target=demo, name="quick-demo")
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    report, folder = done["result"]
    server = start_redis(root / "data" / "redis")
    client = redis.Redis.from_url(server.url)
    yield report, folder, client, out.getvalue()
    client.close()
    server.stop()
