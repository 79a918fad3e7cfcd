"""Feedback ingest: accepted events/s through `POST /v1/feedback` vs `redis-benchmark` XADD.

The agent API runs in its own process (uvicorn, uvloop + httptools) on a fresh Redis; a light
keep-alive HTTP client posts feedback with valid, distinct tokens from many users (so every
post is accepted: token check, value check, rate window, replay marker and XADD in one Lua
call). Then `redis-benchmark` XADDs entries of the same size to the same server, and runs the
intake's Lua call itself: how many accepted events one Redis core takes from all replicas.

    .venv/bin/python bench/bench_feedback_ingest.py [--events 6000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx
import redis

from agents.events import STREAM_FEEDBACK, FeedbackEvent, FeedbackKind, encode
from agents.feedback_intake import _ACCEPT as ACCEPT_SCRIPT
from agents.feedback_tokens import issue
from deploy.embedded_redis import free_port, start_redis

SECRET = "bench-secret-" + "x" * 32
KEY = "bench-key"


def request_bytes(port: int, i: int) -> bytes:
    """One keep-alive POST /v1/feedback with a fresh trajectory and a valid token."""
    trajectory, user = f"traj_bench_{i}", f"user{i % 500}"
    token = issue(SECRET, trajectory, user, "v0", 3600)
    body = json.dumps(
        {"trajectory_id": trajectory, "feedback_token": token, "kind": "thumbs", "value": 1}
    ).encode()
    head = (
        f"POST /v1/feedback HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def post_all(port: int, requests: list[bytes], concurrency: int) -> tuple[int, float]:
    """Send every request over `concurrency` keep-alive connections; (accepted, seconds)."""
    queue = iter(requests)
    accepted = 0

    async def worker() -> None:
        nonlocal accepted
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for raw in queue:
            writer.write(raw)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
            await reader.readexactly(length)
            accepted += head.startswith(b"HTTP/1.1 202")
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return accepted, time.perf_counter() - start


def _sample_fields() -> list[str]:
    sample = FeedbackEvent(
        event_id="fb_" + "0" * 32,
        trajectory_id="traj_bench_0",
        user_id="user0",
        kind=FeedbackKind.THUMBS,
        value=1,
        policy_version="v0",
    )
    return [x for pair in encode(sample).items() for x in pair]


def redis_benchmark(port: int, n: int, concurrency: int, *command: str) -> float:
    """Requests/s that redis-benchmark gets for `command` (__rand_int__ varies per request)."""
    out = subprocess.run(
        [shutil.which("redis-benchmark"), "-h", "127.0.0.1", "-p", str(port)]
        + ["-c", str(concurrency), "-n", str(n), "-r", "1000000000", "-q", *command],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(re.findall(r"([\d.]+) requests per second", out)[-1])


def redis_benchmark_xadd(port: int, n: int, concurrency: int) -> float:
    """XADDs/s that redis-benchmark gets with entries the size of a feedback event."""
    return redis_benchmark(port, n, concurrency, "XADD", "bench:xadd", "*", *_sample_fields())


def redis_benchmark_intake(port: int, n: int, concurrency: int) -> float:
    """The intake's own Lua call/s, Redis side alone: a new user window and trajectory each
    time (INCR, EXPIRE, GET, XADD, SET), so the most work a call can do."""
    keys = ["bench:rate:u__rand_int__", "bench:seen:t__rand_int__:thumbs", "bench:intake"]
    args = ["1000000000", "120", "3600", "fb___rand_int__", *_sample_fields()]
    return redis_benchmark(port, n, concurrency, "EVAL", ACCEPT_SCRIPT, "3", *keys, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=32)
    opts = parser.parse_args()
    if not shutil.which("redis-benchmark"):
        sys.exit("redis-benchmark is not on PATH (apt-get install redis-tools)")
    server = start_redis(Path(tempfile.mkdtemp(prefix="arloop-bench-")) / "redis")
    port = free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": server.url,
        "ARLOOP_PORT": str(port),
        "ARLOOP_SECRET_KEY": SECRET,
        "ARLOOP_API_KEYS": json.dumps([KEY]),
        "ARLOOP_FEEDBACK_RATE_PER_MINUTE": "1000000",
        "ARLOOP_PACKS": '["tutoring"]',
        "ARLOOP_SCRUB_PHI": "false",
        "ARLOOP_LOG_LEVEL": "WARNING",
    }
    api = subprocess.Popen(
        [sys.executable, "-c", "from deploy.agent_api.app import serve; serve()"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        warm = [request_bytes(port, -i) for i in range(1, 201)]
        requests = [request_bytes(port, i) for i in range(opts.events)]
        asyncio.run(post_all(port, warm, opts.concurrency))
        accepted, seconds = asyncio.run(post_all(port, requests, opts.concurrency))
        with redis.Redis.from_url(server.url) as r:
            in_stream = r.xlen(STREAM_FEEDBACK) - len(warm)
        api_rate = accepted / seconds
        xadd_rate = redis_benchmark_xadd(server.port, 100_000, 50)
        intake_rate = redis_benchmark_intake(server.port, 100_000, 50)
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; "
            f"{opts.concurrency} keep-alive connections, {opts.events} posts"
        )
        print(
            f"POST /v1/feedback: {accepted} accepted ({in_stream} in the stream) in "
            f"{seconds:.2f} s = {api_rate:,.0f} events/s"
        )
        print(
            f"redis-benchmark XADD (same server, same entry size, 50 clients): "
            f"{xadd_rate:,.0f} events/s"
        )
        print(
            f"redis-benchmark of the intake's Lua call (same server, 50 clients): "
            f"{intake_rate:,.0f} events/s: what one Redis core can accept from all replicas"
        )
        print(f"API / raw XADD: {api_rate / xadd_rate:.3f} ({xadd_rate / api_rate:.1f}x slower)")
    finally:
        api.terminate()
        api.wait(timeout=10)
        server.stop()


if __name__ == "__main__":
    main()
