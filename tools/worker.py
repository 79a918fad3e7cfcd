"""Worker processes for CPU-bound tools: a call that overruns its timeout is killed, not awaited.

A `CpuTool`'s `compute` (a function of its arguments, pickled by name) runs in a child
process running `serve`, which reads pickled calls on stdin and writes pickled results on
stdout. The caller awaits the answer on the event loop (a reader on the pipe), which stays
free; past the timeout, or when the caller is cancelled, the child gets SIGKILL and the next
call starts a fresh one. A child dies with its parent (`PR_SET_PDEATHSIG`) and has its address
space capped, so neither a runaway loop nor a memory bomb outlives its call or sinks the host.

This fences runaway work on arguments a model wrote (arithmetic, parsing); it is not a jail for
hostile code, which no arloop tool runs.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

A = TypeVar("A")
WORKERS = 2
"""Calls running at once (per event loop); more wait their turn."""
MEMORY_BYTES = 1 << 30
"""Address space of a child (RLIMIT_AS): a call that needs more fails with MemoryError."""
START_TIMEOUT_S = 30.0
"""How long a child may take to start (Python and the tool's imports); not the call's time."""
_HEADER = struct.Struct("!I")
_READY = b"R"


class WorkerDied(RuntimeError):
    """The child ended without answering (killed from outside, or crashed)."""


class _Child:
    """One child process running `serve`, and the pipes to it."""

    def __init__(self, owner: set[_Child]) -> None:
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"from tools.worker import serve; serve({MEMORY_BYTES})"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.owner = owner
        _LIVE.add(self)
        owner.add(self)
        if not _ready(self.proc.stdout.fileno(), time.monotonic() + START_TIMEOUT_S):
            self.kill()
            raise WorkerDied("the tool worker did not start")

    async def call(self, fn: Callable[[A], Any], arg: A, timeout_s: float) -> Any:
        """`fn(arg)` in the child, read without blocking the loop; TimeoutError past `timeout_s`."""
        payload = pickle.dumps((fn, arg))
        os.write(self.proc.stdin.fileno(), _HEADER.pack(len(payload)) + payload)
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes] = loop.create_future()
        fd, buffer = self.proc.stdout.fileno(), bytearray()

        def readable() -> None:
            chunk = os.read(fd, 1 << 16)
            if not chunk and not answered.done():
                answered.set_exception(WorkerDied("the tool worker ended without answering"))
            buffer.extend(chunk)
            if len(buffer) >= _HEADER.size and not answered.done():
                (size,) = _HEADER.unpack_from(buffer)
                if len(buffer) >= _HEADER.size + size:
                    answered.set_result(bytes(buffer[_HEADER.size : _HEADER.size + size]))

        loop.add_reader(fd, readable)
        try:
            ok, value = pickle.loads(await asyncio.wait_for(answered, timeout_s))
        finally:
            loop.remove_reader(fd)
        if ok:
            return value
        raise value

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        _LIVE.discard(self)
        self.owner.discard(self)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


_LIVE: set[_Child] = set()
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool-spawner")
"""Starts every child. `PR_SET_PDEATHSIG` fires when the *thread* that forked a child ends, not
its process: a child forked from an event loop's default executor died with that loop (each
`asyncio.run` of the learner's replays), so calls met dead children. This thread lives as long
as the process."""


def _ready(fd: int, deadline: float) -> bool:
    """The child's one-byte hello arrived by `deadline`."""
    left = deadline - time.monotonic()
    return bool(select.select([fd], [], [], max(left, 0))[0]) and os.read(fd, 1) == _READY


class WorkerPool:
    """At most `size` calls at once per event loop, each in an idle child (started as needed);
    a child whose call timed out or was cancelled is killed, never reused."""

    def __init__(self, size: int = WORKERS) -> None:
        self.size = size
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()
        self._lock = threading.Lock()
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def run(self, fn: Callable[[A], Any], arg: A, timeout_s: float) -> Any:
        """`fn(arg)` in a child process: its value, its exception, or TimeoutError."""
        loop = asyncio.get_running_loop()
        gate = self._gates.setdefault(loop, asyncio.Semaphore(self.size))
        async with gate:
            child = self._take() or await self._start()
            try:
                value = await child.call(fn, arg, timeout_s)
            except BaseException:  # timeout, cancellation, a dead child: mid-call, so killed
                child.kill()
                raise
            with self._lock:
                self._idle.append(child)
            return value

    async def _start(self) -> _Child:
        """A new child, started by the spawner thread; one whose caller was cancelled meanwhile
        is killed."""
        loop = asyncio.get_running_loop()
        starting = asyncio.ensure_future(loop.run_in_executor(_SPAWNER, _Child, self._children))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_kill_started)
            raise

    def _take(self) -> _Child | None:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive():
                    return child
                child.kill()
        return None

    def pids(self) -> list[int]:
        """This pool's live children's process ids (for tests and diagnostics)."""
        return [c.pid for c in list(self._children) if c.alive()]


def _kill_started(starting: asyncio.Future[_Child]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        starting.result().kill()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process's one pool (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
        return _POOL


@atexit.register
def _kill_children() -> None:
    for child in list(_LIVE):
        child.kill()


# -- the child ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent ends (a spinning call never orphans)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(memory_bytes: int) -> None:
    """The child's loop: answer pickled calls on stdin until the parent closes it."""
    import resource

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a print in tool code must not corrupt the protocol
    stdout.write(_READY)
    stdout.flush()
    while True:
        head = stdin.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return  # the parent closed the pipe
        data = stdin.read(_HEADER.unpack(head)[0])
        try:
            fn, arg = pickle.loads(data)
            reply = pickle.dumps((True, fn(arg)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            reply = _pickled_error(exc)
        stdout.write(_HEADER.pack(len(reply)) + reply)
        stdout.flush()


def _pickled_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps((False, exc))
    except Exception:  # noqa: BLE001 - an exception that cannot travel travels as its text
        return pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
