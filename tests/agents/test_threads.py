"""Thread records: ownership, one run at a time, and the canary arm drawn once per thread."""

from __future__ import annotations

import random

import pytest

from agents.events import POLICY_ALIASES
from agents.policy_client import PolicyConfig
from agents.runtime import AgentRuntime, AgentSpec
from agents.threads import CANDIDATE, CHAMPION, ThreadError, Threads
from tests.fakes.scripted_llm import Reply


async def test_arm_is_drawn_once_per_thread_and_sticks(aredis):
    await aredis.hset(POLICY_ALIASES, mapping={CHAMPION: "v1", CANDIDATE: "v2"})
    threads = Threads(aredis, canary_share=0.3, rng=random.Random(7))
    arms = {}
    for i in range(40):
        lease = await threads.open(f"t{i}", "u1", "tutor")
        assert lease.new
        arms[f"t{i}"] = lease.arm
        await threads.close(lease)
    assert 3 <= list(arms.values()).count(CANDIDATE) <= 25  # seeded draw, share 0.3
    for thread_id, arm in arms.items():
        lease = await threads.open(thread_id, "u1", "tutor")
        assert (lease.arm, lease.new) == (arm, False)
        await threads.close(lease)


async def test_no_candidate_means_champion_and_candidate_threads_fall_back(aredis):
    threads = Threads(aredis, canary_share=1.0)
    await aredis.hset(POLICY_ALIASES, CHAMPION, "v1")
    assert (await threads.open("a", "u1", "tutor")).arm == CHAMPION
    await aredis.hset(POLICY_ALIASES, CANDIDATE, "v2")
    lease = await threads.open("b", "u1", "tutor")
    assert lease.arm == CANDIDATE
    await threads.close(lease)
    await aredis.hdel(POLICY_ALIASES, CANDIDATE)  # promoted or rolled back
    assert (await threads.open("b", "u1", "tutor")).arm == CHAMPION
    assert await threads.arm("b") == CHAMPION


async def test_threads_belong_to_one_user_one_agent_and_run_one_at_a_time(aredis):
    threads = Threads(aredis)
    lease = await threads.open("t", "u1", "tutor")
    with pytest.raises(ThreadError) as other_user:
        await threads.open("t", "u2", "tutor")
    with pytest.raises(ThreadError) as other_agent:
        await threads.open("t", "u1", "triage")
    with pytest.raises(ThreadError) as busy:
        await threads.open("t", "u1", "tutor")
    assert (other_user.value.status, other_agent.value.status, busy.value.status) == (403, 409, 409)
    assert "another request" in busy.value.reason
    await threads.close(lease)
    await threads.close(await threads.open("t", "u1", "tutor"))


async def test_canary_routing_end_to_end_is_sticky_per_thread(aredis, llm):
    await aredis.hset(POLICY_ALIASES, mapping={CHAMPION: "v1", CANDIDATE: "v2"})
    llm.fingerprints = {"arloop@champion": "v1", "arloop@candidate": "v2"}
    llm.responder = lambda request: Reply(content="ok")
    policy = PolicyConfig(model="openai/arloop", api_base=llm.base_url, api_key="k", retries=0)
    spec = AgentSpec(name="tutor", description="d", system_prompt="s")
    rt = AgentRuntime.on_redis(aredis, [spec], policy, canary_share=0.5, rng=random.Random(3))
    firsts = [await rt.run("tutor", "q", "u1") for _ in range(12)]
    assert {e.policy_version for e in firsts} == {"v1", "v2"}
    for first in firsts:
        again = await rt.run("tutor", "q2", "u1", thread_id=first.thread_id)
        assert again.policy_version == first.policy_version
        arm = CANDIDATE if first.policy_version == "v2" else CHAMPION
        assert llm.requests[-1]["model"] == f"arloop@{arm}"
