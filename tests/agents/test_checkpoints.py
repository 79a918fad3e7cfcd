"""The plain-Redis checkpointer passes LangGraph's checkpointer conformance suite on our Redis."""

from __future__ import annotations

import redis.asyncio as aioredis
from langgraph.checkpoint.conformance import checkpointer_test, validate

from agents.checkpoints import make_checkpointer
from agents.events import CHECKPOINT_PREFIX
from tests.fakes.fixtures import PATIENT_S


async def test_conformance_on_the_test_redis(redis_url):
    @checkpointer_test(name="arloop-plainredis")
    async def saver():
        client = aioredis.from_url(redis_url, socket_timeout=PATIENT_S)
        yield make_checkpointer(client)
        await client.aclose()

    report = await validate(saver)
    failures = {n: r.failures for n, r in report.results.items() if r.passed is False}
    assert report.passed_all() and report.passed_all_base(), failures
    assert sum(r.tests_passed for r in report.results.values()) > 0
    client = aioredis.from_url(redis_url, socket_timeout=PATIENT_S)
    keys = [k.decode() async for k in client.scan_iter(match="*")]
    await client.aclose()
    assert keys and all(k.startswith(f"{CHECKPOINT_PREFIX}:") for k in keys)
