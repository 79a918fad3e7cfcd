"""CPU-bound tools run in worker processes that a timeout kills: the sandbox contract holds for
work that never yields (a spin, a memory bomb, endless recursion), and the loop stays free."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

from tests.fakes.tools import Hog, NoArgs, Recurse, Spin
from tools import Calculator, ToolRegistry
from tools.worker import WorkerPool, shared_pool


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


async def test_a_spinning_tool_is_killed_at_its_timeout_and_the_loop_keeps_running():
    registry = ToolRegistry([Spin(), Calculator()])
    await registry.call("calculator", {"expression": "1+1"}, "warm")  # a child is up
    before = set(shared_pool().pids())
    ticks = 0
    spinning = asyncio.create_task(registry.call("spin", {}, "c1"))

    while not spinning.done():  # the loop is free: this coroutine runs while the tool spins
        ticks += 1
        await asyncio.sleep(0.05)
    result = spinning.result()

    assert ticks > 0
    assert result.error == "timeout" and "timed out after 1 s" in result.output
    killed = before - set(shared_pool().pids())
    assert killed and not any(_alive(pid) for pid in killed), "the spinning child was not killed"
    after = await registry.call("calculator", {"expression": "6*7"}, "c2")
    assert (after.output, after.error) == ("42", None)  # a fresh child serves the next call


async def test_memory_bomb_and_endless_recursion_become_error_observations():
    registry = ToolRegistry([Hog(), Recurse()])
    hog = await registry.call("hog", {}, "c1")
    deep = await registry.call("recurse", {}, "c2")
    assert (hog.error, hog.output) == ("exception", "Error: hog failed (MemoryError).")
    assert (deep.error, deep.output) == ("exception", "Error: recurse failed (RecursionError).")


async def test_a_cancelled_call_kills_its_child():
    pool = WorkerPool(1)  # its own: the only child is the one that spins
    task = asyncio.create_task(pool.run(Spin.compute, NoArgs(), 3600.0))
    deadline = time.monotonic() + 30
    while not pool.pids():
        assert time.monotonic() < deadline, "the worker never started"
        await asyncio.sleep(0.02)
    (spinning,) = pool.pids()
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    deadline = time.monotonic() + 30  # a child cancelled while starting is killed once up
    while _alive(spinning) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert task.cancelled() and not _alive(spinning) and pool.pids() == []


def test_a_child_dies_with_its_parent(tmp_path):
    """kill -9 of the process that started a spinning call leaves no orphan spinning on."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        from tools import ToolRegistry
        from tools.worker import shared_pool
        from tests.fakes.tools import Spin

        Spin.timeout_s = 3600.0
        async def main():
            task = asyncio.create_task(ToolRegistry([Spin()]).call("spin", {}, "c"))
            while not shared_pool().pids():
                await asyncio.sleep(0.02)
            print(shared_pool().pids()[0], flush=True)
            await task
        asyncio.run(main())
        """
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the worker outlived its parent"
    finally:
        parent.kill()
        parent.stdout.close()


def test_a_child_outlives_the_event_loop_and_the_thread_that_started_it():
    """The learner replays tool calls in one `asyncio.run` after another, from any thread: a
    child started in one loop serves the next (it once died with the loop's executor thread,
    and every replayed calculator call failed)."""
    pool = WorkerPool(size=1)

    def once() -> str:
        async def call() -> str:
            return await pool.run(Calculator.compute, Calculator.Args(expression="6*7"), 10.0)

        return asyncio.run(call())

    answers: list[str] = []
    starter = threading.Thread(target=lambda: answers.append(once()))
    starter.start()
    starter.join()
    (pid,) = pool.pids()
    time.sleep(0.5)  # a child tied to the ended thread is SIGKILLed at once
    assert _alive(pid), "the worker died with the thread that started it"
    answers.append(once())
    assert answers == ["42", "42"]
    assert pool.pids() == [pid], "the second loop reused the first loop's child"
