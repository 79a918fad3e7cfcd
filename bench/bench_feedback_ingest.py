"""Feedback ingest: accepted events/s through arloop's `POST /v1/feedback`, against the
endpoint a user would write instead, and against `redis-benchmark` XADD.

The agent API runs in its own process (uvicorn, uvloop + httptools) on a fresh Redis; a light
keep-alive HTTP client posts feedback with valid, distinct tokens from many users (so every
post is accepted: API key, token check, value check, user and key rate windows, replay
marker and XADD in one Lua call; a well-formed post is served before FastAPI's routing, by
`deploy/agent_api/ingest.py`). The peer (`bench/feedback_peer.py`: a pydantic body, the
sealed-token check, one XADD) runs under the same uvicorn settings on the same Redis and gets the
same posts. Then `redis-benchmark` XADDs entries of the same size to the same server and runs the
intake's Lua call itself: how many accepted events one Redis core takes from all replicas. The
goal: arloop at 0.8x the peer or better.

    .venv/bin/python bench/bench_feedback_ingest.py [--events 3000] [--rounds 3] [--concurrency 32]
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


ARLOOP = "from deploy.agent_api.app import serve; serve()"
PEER = (  # the settings `arloop serve agents` runs uvicorn with (deploy/agent_api/app.py serve)
    "import uvicorn; from bench.feedback_peer import app; uvicorn.run(app, host='127.0.0.1', "
    "port={port}, log_level='warning', loop='uvloop', http='httptools', log_config=None, "
    "access_log=False)"
)


def start_server(code: str, port: int, env: dict[str, str]) -> subprocess.Popen:
    """A uvicorn process, returned once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env | {"ARLOOP_AGENTS_PORT": str(port)}
    )
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    sys.exit(f"the server did not start on port {port}: {code}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    server: subprocess.Popen, port: int, concurrency: int, events: int, offset: int
) -> tuple[int, float, float]:
    """Warm up, then post `events` fresh feedbacks; (accepted, seconds, server CPU s)."""
    warm = [request_bytes(port, offset - i) for i in range(1, 201)]
    asyncio.run(post_all(port, warm, concurrency))
    posts = [request_bytes(port, offset + i) for i in range(events)]
    before = cpu_seconds(server.pid)
    accepted, seconds = asyncio.run(post_all(port, posts, concurrency))
    return accepted, seconds, cpu_seconds(server.pid) - before


def _median(runs: list[tuple[int, float, float]]) -> tuple[int, float, float]:
    """The run with the median rate."""
    return sorted(runs, key=lambda r: r[0] / r[1])[len(runs) // 2]


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
    """The intake's own Lua call/s, Redis side alone: a new user window, key window and
    trajectory each time (GET, INCR, EXPIRE twice, SET, XADD), so the most work a call does."""
    keys = [
        "bench:rate:u__rand_int__",
        "bench:seen:t__rand_int__:thumbs",
        "bench:intake",
        "bench:keyrate:k__rand_int__",
        "bench:scores:t__rand_int__",
    ]
    # no named-score cap (thumbs), the default stream cap (XADD MAXLEN ~ 200000)
    args = ["1000000000", "120", "3600", "fb___rand_int__", "1000000000", "0", "200000"]
    args += _sample_fields()
    return redis_benchmark(port, n, concurrency, "EVAL", ACCEPT_SCRIPT, "5", *keys, *args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    if not shutil.which("redis-benchmark"):
        sys.exit("redis-benchmark is not on PATH (apt-get install redis-tools)")
    server = start_redis(Path(tempfile.mkdtemp(prefix="arloop-bench-")) / "redis")
    port, peer_port = free_port(), free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": server.url,
        "ARLOOP_SECRET_KEY": SECRET,
        "ARLOOP_API_KEYS": json.dumps([KEY]),
        "ARLOOP_FEEDBACK_RATE_PER_MINUTE": "1000000",
        "ARLOOP_KEY_RATE_PER_MINUTE": "1000000",
        "ARLOOP_PACKS": '["tutoring"]',
        "ARLOOP_SCRUB_PHI": "false",
        "ARLOOP_LOG_LEVEL": "WARNING",
        "PEER_SECRET": SECRET,
        "PEER_REDIS_URL": server.url,
    }
    api = start_server(ARLOOP, port, env)
    peer = start_server(PEER.format(port=peer_port), peer_port, env)
    try:
        arloop_runs, peer_runs = [], []
        for k in range(opts.rounds):  # alternated: a machine whose load moves hits both alike
            arloop_runs.append(measure(api, port, opts.concurrency, opts.events, k * 10**6))
            peer_runs.append(
                measure(peer, peer_port, opts.concurrency, opts.events, -(k + 1) * 10**6)
            )
        (accepted, seconds, cpu), (peer_accepted, peer_seconds, peer_cpu) = (
            _median(arloop_runs),
            _median(peer_runs),
        )
        with redis.Redis.from_url(server.url) as r:
            in_stream = r.xlen(STREAM_FEEDBACK) - 200 * opts.rounds
            peer_stream = r.xlen("bench:peer:feedback") - 200 * opts.rounds
        api_rate, peer_rate = accepted / seconds, peer_accepted / peer_seconds
        xadd_rate = redis_benchmark_xadd(server.port, 100_000, 50)
        intake_rate = redis_benchmark_intake(server.port, 100_000, 50)
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; "
            f"{opts.concurrency} keep-alive connections, {opts.events} posts per round, "
            f"{opts.rounds} rounds each, alternated (medians)"
        )
        print(
            f"arloop POST /v1/feedback: {accepted} accepted ({in_stream} in the stream, all rounds) in "
            f"{seconds:.2f} s = {api_rate:,.0f} events/s; server CPU "
            f"{cpu / accepted * 1e6:.0f} us/event"
        )
        print(
            f"peer (pydantic body, token check, XADD; same uvicorn settings): {peer_accepted} "
            f"accepted ({peer_stream} in its stream, all rounds) in {peer_seconds:.2f} s = "
            f"{peer_rate:,.0f} events/s; server CPU {peer_cpu / peer_accepted * 1e6:.0f} us/event"
        )
        print(
            f"redis-benchmark XADD (same server, same entry size, 50 clients): "
            f"{xadd_rate:,.0f} events/s"
        )
        print(
            f"redis-benchmark of the intake's Lua call (same server, 50 clients): "
            f"{intake_rate:,.0f} events/s: what one Redis core can accept from all replicas"
        )
        verdict = "meets" if api_rate / peer_rate >= 0.8 else "MISSES"
        print(f"arloop / peer: {api_rate / peer_rate:.2f}x ({verdict} the 0.8x goal)")
        print(
            f"server CPU per event, peer / arloop: {peer_cpu / peer_accepted / (cpu / accepted):.2f}x "
            "(the rate each would reach with a core to itself)"
        )
        print(
            f"arloop / raw XADD: {api_rate / xadd_rate:.3f}; peer / raw XADD: {peer_rate / xadd_rate:.3f}"
        )
    finally:
        for proc in (api, peer):
            proc.terminate()
            proc.wait(timeout=10)
        server.stop()


if __name__ == "__main__":
    main()
