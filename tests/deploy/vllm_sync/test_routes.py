"""Agents reach the adapters the sync loaded: through litellm's `hosted_vllm/<adapter>` over
real HTTP to the fake vLLM, each arm to its alias's adapter, the trajectory step naming the
version (not the adapter) with vLLM's token ids and logprobs."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from agents.adapter_routes import RoutedPolicyClient, policy_client
from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from learner.policy.registry import CANDIDATE, CHAMPION
from tests.fakes.scripted_llm import token_ids

MESSAGES = [{"role": "user", "content": "what is 2+3?"}]


def _config(world, model: str = "hosted_vllm/arloop", **overrides) -> PolicyConfig:
    values = {"model": model, "api_base": world.server.url + "/v1", "api_key": "none"}
    return PolicyConfig(**(values | {"retries": 0, "timeout_s": 10} | overrides))


def _complete(world, redis_url, arm, **config):
    async def go():
        client = aioredis.from_url(redis_url)
        try:
            policy = policy_client(_config(world, **config), client)
            return policy, await policy.complete(MESSAGES, arm=arm)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_each_arm_calls_its_aliases_adapter_and_the_step_names_the_version(world, redis_url):
    v1 = world.publish(seed=1)
    v2 = world.publish(seed=2, champion=False)
    world.registry.open_candidate(v2, reason="test", actor="test")
    world.sync.step()
    for arm, version in ((CHAMPION, v1), (CANDIDATE, v2), (None, v1)):
        policy, step = _complete(world, redis_url, arm)
        assert isinstance(policy, RoutedPolicyClient)
        adapter = world.adapter(version)
        assert world.fake.posted("chat")[-1]["model"] == adapter  # what vLLM was asked for
        assert step.output == f"answer from {adapter}"
        assert step.model == f"hosted_vllm/{adapter}" and step.policy_version == version
        assert step.engine == "vllm"  # the learner recomputes behaviour logprobs for it
        assert step.completion_token_ids == token_ids(step.output)
        assert step.prompt_token_ids == [1, 2, 3] and len(step.logprobs) == len(
            token_ids(step.output)
        )
    sent = world.fake.posted("chat")[-1]
    assert sent["logprobs"] is True and sent["return_token_ids"] is True


def test_the_route_follows_a_new_champion_after_the_sync_pass(world, redis_url):
    world.publish(seed=1)
    world.sync.step()
    v2 = world.publish(seed=2)
    _, before = _complete(world, redis_url, CHAMPION)
    assert before.policy_version == "v1"  # the sync has not loaded v2 yet: v1 still serves
    world.sync.step()
    _, after = _complete(world, redis_url, CHAMPION)
    assert after.policy_version == v2 and after.model == f"hosted_vllm/{world.adapter(v2)}"


def test_an_arm_with_no_route_is_a_502_naming_the_sync(world, redis_url):
    with pytest.raises(PolicyError, match="no vLLM adapter serves 'champion' yet") as caught:
        _complete(world, redis_url, CHAMPION)  # no sync pass yet: no record
    assert caught.value.status == 502 and "vllm-sync --check" in str(caught.value)


def test_other_model_strings_keep_the_plain_client(world, redis_url):
    async def go(config):
        client = aioredis.from_url(redis_url)
        try:
            return policy_client(config, client)
        finally:
            await client.aclose()

    for config in (
        _config(world, model="openai/arloop"),
        _config(world, model="hosted_vllm/arloop", versioned=False),
    ):
        policy = asyncio.run(go(config))
        assert type(policy) is PolicyClient
