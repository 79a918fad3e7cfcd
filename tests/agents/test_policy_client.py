"""The policy client over litellm: versions, tokens, retries, and errors mapped to 502/504."""

from __future__ import annotations

import pytest

from agents.policy_client import PolicyClient, PolicyConfig, PolicyError
from deploy.embedded_redis import free_port
from tests.fakes.scripted_llm import Reply

HI = [{"role": "user", "content": "hi"}]


def client(llm, **kw) -> PolicyClient:
    cfg = {"model": "openai/arloop", "api_base": llm.base_url, "api_key": "k", "retries": 0}
    return PolicyClient(PolicyConfig(**(cfg | kw)))


async def test_versioned_arms_name_the_model_and_the_fingerprint_is_the_version(llm):
    llm.fingerprints = {"arloop@candidate": "v3"}
    llm.push(Reply(content="a"), Reply(content="b"))
    step = await client(llm).complete(HI, arm="candidate", index=4)
    assert llm.requests[0]["model"] == "arloop@candidate"
    assert llm.requests[0]["logprobs"] is True and llm.requests[0]["return_token_ids"] is True
    assert (step.index, step.model, step.policy_version, step.output) == (
        4,
        "openai/arloop@candidate",
        "v3",
        "a",
    )
    plain = await client(llm, versioned=False).complete(HI, arm="candidate")
    assert llm.requests[1]["model"] == "arloop" and plain.model == "openai/arloop"


async def test_without_fingerprint_or_token_info_the_model_name_stands_in(llm):
    llm.push(Reply(content="a", fingerprint="", token_info=False))
    step = await client(llm).complete(HI, arm="champion")
    assert step.policy_version == "arloop@champion"
    assert step.prompt_token_ids is None and step.completion_token_ids is None
    assert step.logprobs is None


async def test_server_error_is_502_with_a_reason(llm):
    llm.push(Reply(status=500))
    with pytest.raises(PolicyError) as err:
        await client(llm).complete(HI)
    assert err.value.status == 502 and "InternalServerError" in err.value.reason


async def test_timeout_is_504(llm):
    llm.push(Reply(content="late", delay_s=3))
    with pytest.raises(PolicyError) as err:
        await client(llm, timeout_s=0.5).complete(HI)
    assert err.value.status == 504 and "timed out after 0.5 s" in err.value.reason


async def test_unreachable_endpoint_is_502():
    dead = PolicyConfig(
        model="openai/arloop", api_base=f"http://127.0.0.1:{free_port()}/v1", api_key="k", retries=0
    )
    with pytest.raises(PolicyError) as err:
        await PolicyClient(dead).complete(HI)
    assert err.value.status == 502 and "Connection error" in err.value.reason


async def test_retries_ride_over_transient_failures(llm):
    llm.push(Reply(status=503), Reply(status=500), Reply(content="ok"))
    step = await client(llm, retries=2).complete(HI)
    assert step.output == "ok" and len(llm.requests) == 3
