"""The OpenAI request schema both endpoints take (agents/openai_requests.py): one copy of the
messages, tools and formats, the same 400 naming the same field on the agent API and the policy
server, each endpoint's own bounds kept."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agents.openai_requests import ChatRequestBase, OpenAIError, error_param
from deploy.agent_api.chat_wire import ChatCompletionRequest
from deploy.policy_server.openai_wire import ChatRequest

ENDPOINTS = [ChatCompletionRequest, ChatRequest]
HI = [{"role": "user", "content": "hi"}]
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


def refused(cls: type[ChatRequestBase], **patch) -> str:
    """The `param` of the 400 that `cls` gives this body (the deepest error, as both apps)."""
    try:
        cls.model_validate({"model": "arloop", "messages": HI, **patch})
    except OpenAIError as exc:
        assert exc.status == 400
        return str(exc.param)
    except ValidationError as exc:
        return error_param(max((e["loc"] for e in exc.errors()), key=len))
    raise AssertionError(f"{cls.__name__} took {patch}")


def test_one_copy_of_the_parts():
    for field in ("messages", "tools", "tool_choice", "response_format", "stream_options"):
        annotations = {cls.model_fields[field].annotation for cls in ENDPOINTS}
        assert len(annotations) == 1, field
    assert all(issubclass(cls, ChatRequestBase) for cls in ENDPOINTS)


@pytest.mark.parametrize("cls", ENDPOINTS)
@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"messages": [{"content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages.0.content.0.type",
        ),
        ({"messages": [{"role": "tool", "content": "1"}]}, "messages.0.tool_call_id"),
        ({"messages": [{"role": "system"}]}, "messages.0.content"),
        (
            {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": ""}}},
            "tool_choice.function.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"tools": [{**ADD, "function": {"name": "f", "parameters": {"x": float("nan")}}}]},
            "tools.0.function.parameters.x",
        ),
        ({"logit_bias": {"\ud800": 1}}, "logit_bias"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ],
)
def test_the_same_bad_part_is_the_same_400_on_both_endpoints(cls, patch, param):
    assert refused(cls, **patch) == param


def test_each_endpoint_keeps_its_own_bounds():
    assert refused(ChatCompletionRequest, n=17) == "n"  # the agent API's ceiling
    assert ChatRequest.model_validate({"model": "arloop", "messages": HI, "n": 17}).n == 17
    assert refused(ChatCompletionRequest, seed=2**60) == "seed"  # +-2**53: exact in any JSON
    assert ChatRequest.model_validate({"model": "arloop", "messages": HI, "seed": 2**60})
    assert refused(ChatRequest, return_token_ids="yes") == "return_token_ids"
    assert refused(ChatCompletionRequest, return_token_ids=True) == "return_token_ids"


@pytest.mark.parametrize("cls", ENDPOINTS)
def test_an_unknown_key_of_a_message_is_named_and_an_echoed_null_dropped(cls):
    echoed = [{"role": "assistant", "content": "hi", "refusal": None, "audio": None}]
    assert cls.model_validate({"model": "arloop", "messages": echoed}).messages[0].content == "hi"
    extra = [{"role": "user", "content": "hi", "provider_specific_fields": {"a": 1}}]
    assert refused(cls, messages=extra) == "messages.0.provider_specific_fields"


def test_the_agent_api_forwards_a_json_schema_as_openai_spells_it():
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    req = ChatCompletionRequest.model_validate(
        {"model": "arloop", "messages": HI, "response_format": fmt}
    )
    assert req.upstream()["response_format"] == fmt
    assert ChatRequest.model_validate({**req.upstream(), "model": "arloop"}).response_format
