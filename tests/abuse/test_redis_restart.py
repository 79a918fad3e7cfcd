"""Redis killed (-9) and restarted under feedback load: every acknowledged event is there once,
and once Redis is back no request fails on a stale pooled connection.

A real redis-server (append-only, fsync on every write: with `everysec` Redis itself may
acknowledge a write it has not yet handed to the file while a slow fsync runs, and a kill -9
then loses it, which is Redis's documented window, not arloop's) on loopback; the agent API over real HTTP. A burst
of 16 clients grows the API's connection pool, a trickle of 2 clients goes on while Redis is
killed and restarted (so most pooled connections sit idle through the outage, stale after
it), then 16 clients again. Each client sends one feedback per run and retries a 5xx as a
client should (after Retry-After).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from agents.events import STREAM_FEEDBACK, decode
from deploy.embedded_redis import start_redis
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

RUNS = 240
CLIENTS = 16
GRACE_S = 1.0  # after Redis answers again: pooled connections get this long to notice


def _fsync_always(url: str) -> None:
    with redis.Redis.from_url(url) as r:
        r.config_set("appendfsync", "always")


@pytest.fixture
def own_redis(tmp_path):
    server = start_redis(tmp_path / "redis")
    _fsync_always(server.url)
    yield server
    server.stop()


def test_kill_and_restart_loses_and_doubles_nothing(start_api, llm, own_redis):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(redis_url=own_redis.url, feedback_rate_per_minute=10_000)
    runs = [api.run(f"q{i}", user=f"u{i % 40}").json() for i in range(RUNS)]
    outcomes: list[tuple[str, float, int]] = []  # (trajectory, sent at, final status)
    errors: list[tuple[float, int]] = []  # every non-202 answer: (sent at, status)
    lock = threading.Lock()

    def send(run: dict) -> None:
        body = {
            "trajectory_id": run["trajectory_id"],
            "feedback_token": run["feedback_token"],
            "kind": "thumbs",
            "value": 1,
        }
        with httpx.Client(base_url=api.server.url, timeout=30) as http:
            for _ in range(40):
                sent = time.monotonic()
                reply = http.post(
                    "/v1/feedback", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
                )
                with lock:
                    if reply.status_code != 202:
                        errors.append((sent, reply.status_code))
                if reply.status_code not in (500, 502, 503, 504):
                    break
                time.sleep(float(reply.headers.get("Retry-After", "1")) / 4)
        with lock:
            outcomes.append((run["trajectory_id"], sent, reply.status_code))

    third = RUNS // 3
    with ThreadPoolExecutor(CLIENTS) as burst:  # the pool grows to ~CLIENTS connections
        list(burst.map(send, runs[:third]))
    with ThreadPoolExecutor(2) as light:  # a trickle through the outage: most connections idle
        trickle = [light.submit(send, run) for run in runs[third : 2 * third]]
        while len(outcomes) < third + 10:
            time.sleep(0.005)
        os.kill(own_redis.process.pid, signal.SIGKILL)
        own_redis.process.wait()
        killed_at = time.monotonic()
        time.sleep(1.5)
        own_redis.process = start_redis(own_redis.directory, port=own_redis.port).process
        back_at = time.monotonic()
        _fsync_always(own_redis.url)
        for future in trickle:
            future.result()
    with ThreadPoolExecutor(CLIENTS) as burst:  # every pooled connection in use again
        list(burst.map(send, runs[2 * third :]))

    acked = {t for t, _, status in outcomes if status == 202}
    with redis.Redis.from_url(own_redis.url) as r:
        logged = [decode(f).trajectory_id for _, f in r.xrange(STREAM_FEEDBACK)]
    late = [(round(s - back_at, 2), st) for s, st in errors if s > back_at + GRACE_S]
    during = [st for s, st in errors if killed_at <= s <= back_at + GRACE_S]
    assert len(outcomes) == RUNS and {st for _, _, st in outcomes} <= {202, 409}, outcomes
    assert acked <= set(logged), f"{len(acked - set(logged))} acknowledged events lost"
    assert len(logged) == len(set(logged)), "an event was written twice"
    assert late == [], f"errors after Redis was back: {late}"
    print(
        f"\nredis restart: {len(acked)} acked, {len(logged)} logged, "
        f"{len(during)} errors during the outage ({back_at - killed_at:.2f} s), 0 after"
    )
