"""How many events/s the learner's intake absorbs: `TrajectorySource.poll()` (XREADGROUP, decode
and validate each event, one SQLite transaction with synchronous=FULL, then XACK) against a
bare consumer of the same entries in the same run (XREADGROUP + XACK, no decode, no store).

The streams hold `--runs` tutor-like trajectories (two model calls with token ids and
logprobs, one tool call; about the size of a demo run) and as many feedback events. That
rate is the ceiling on what one learner can keep up with, whatever its rounds train; the
round's own cost is bench_learner.py's.

    .venv/bin/python bench/bench_learner_source.py [--runs 5000]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis

from agents.events import (
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    FeedbackEvent,
    FeedbackKind,
    ModelStep,
    ToolStep,
    TrajectoryEvent,
    encode,
)
from deploy.embedded_redis import start_redis
from learner.store import Store
from learner.trajectory_source import TrajectorySource

SYSTEM = "You are a maths tutor. Use the calculator for arithmetic. " * 20  # ~1.2 KB


def model_step(rng: random.Random, index: int, prompt: int, completion: int) -> ModelStep:
    return ModelStep(
        index=index,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x" * 120}],
        tool_names=["calculator"],
        output="CALL calculator: 47+38" if index == 0 else "#### 85",
        model="openai/arloop",
        policy_version="v0",
        prompt_token_ids=[rng.randrange(49152) for _ in range(prompt)],
        completion_token_ids=[rng.randrange(49152) for _ in range(completion)],
        logprobs=[-rng.random() * 3 for _ in range(completion)],
        latency_ms=800.0,
    )


def events(n: int, seed: int = 0) -> tuple[list[TrajectoryEvent], list[FeedbackEvent]]:
    rng = random.Random(seed)
    runs, feedback = [], []
    for i in range(n):
        steps = [
            model_step(rng, 0, 320, 24),
            ToolStep(
                index=1,
                call_id="c1",
                name="calculator",
                arguments="47+38",
                output="85",
                latency_ms=1.0,
            ),
            model_step(rng, 2, 360, 12),
        ]
        now = time.time()
        run = TrajectoryEvent(
            event_id=f"traj_{i}",
            thread_id=f"th_{i}",
            agent="tutor",
            user_id=f"u{i % 500}",
            input="Sam has 47 apples and buys 38 more. How many now?",
            output="#### 85",
            policy_version="v0",
            steps=steps,
            started_at=now - 2,
            finished_at=now,
        )
        runs.append(run)
        feedback.append(
            FeedbackEvent(
                event_id=f"fb_{i}",
                trajectory_id=run.event_id,
                user_id=run.user_id,
                kind=FeedbackKind.THUMBS,
                value=1.0,
                policy_version="v0",
                agent="tutor",
            )
        )
    return runs, feedback


def fill(client: redis.Redis, runs: list, feedback: list) -> float:
    """XADD everything; the mean encoded trajectory size in bytes."""
    size = 0
    pipe = client.pipeline(transaction=False)
    for i, (run, fb) in enumerate(zip(runs, feedback, strict=True)):
        fields = encode(run)
        size += sum(len(str(v)) for v in fields.values())
        pipe.xadd(STREAM_TRAJECTORIES, fields)
        pipe.xadd(STREAM_FEEDBACK, encode(fb))
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    return size / len(runs)


def bare_consumer(client: redis.Redis, total: int) -> float:
    """Seconds for XREADGROUP + XACK of every entry, 256 a stream per read."""
    streams = {STREAM_TRAJECTORIES: ">", STREAM_FEEDBACK: ">"}
    for stream in streams:
        client.xgroup_create(stream, "bare", id="0")
    done, start = 0, time.perf_counter()
    while done < total:
        for stream, items in client.xreadgroup("bare", "b1", streams, count=256) or []:
            client.xack(stream, "bare", *[entry_id for entry_id, _ in items])
            done += len(items)
    return time.perf_counter() - start


def learner_source(client: redis.Redis, store_path: Path, total: int) -> tuple[float, dict]:
    """Seconds for the learner's source to move every entry into its store."""
    store = Store(store_path)
    source = TrajectorySource(client, store, "bench", block_ms=10)
    source.ensure_groups()
    done, start = 0, time.perf_counter()
    while done < total:
        result = source.poll()
        done += result.new + result.duplicates
        assert not result.dead, result.dead
    seconds = time.perf_counter() - start
    counts = store.counts()
    store.close()
    return seconds, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-source-"))
    server = start_redis(work / "redis")
    runs, feedback = events(opts.runs)
    total = 2 * opts.runs
    try:
        with redis.Redis.from_url(server.url) as client:
            size = fill(client, runs, feedback)
            bare = bare_consumer(client, total)
            ours, counts = learner_source(client, work / "store.db", total)
        print(
            f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}; {opts.runs} "
            f"trajectories (mean {size / 1024:.1f} KiB encoded) + {opts.runs} feedback events"
        )
        print(f"bare XREADGROUP + XACK:            {total / bare:>9,.0f} events/s")
        print(f"learner source (decode, SQLite):   {total / ours:>9,.0f} events/s  ({counts})")
        print(f"learner / bare: {bare / ours:.3f} ({ours / bare:.1f}x slower)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
