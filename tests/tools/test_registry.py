"""The sandbox: every failure of a tool call becomes an error observation, never a raise."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, Field

from tools import Calculator, Tool, ToolError, ToolRegistry


class EchoArgs(BaseModel):
    text: str
    times: int = Field(default=1, ge=1, le=3)


class Echo(Tool):
    name = "echo"
    description = "Repeat the text."
    Args = EchoArgs

    async def run(self, args: EchoArgs) -> str:
        return args.text * args.times


class Hang(Tool):
    name = "hang"
    description = "Never answers."
    Args = EchoArgs
    timeout_s = 0.2

    async def run(self, args: EchoArgs) -> str:
        await asyncio.sleep(3600)
        return "unreachable"


class Broken(Tool):
    name = "broken"
    description = "Raises."
    Args = EchoArgs

    async def run(self, args: EchoArgs) -> str:
        raise KeyError("secret internal detail")


class Refuses(Tool):
    name = "refuses"
    description = "Raises a ToolError."
    Args = EchoArgs

    async def run(self, args: EchoArgs) -> str:
        raise ToolError("nothing found for that text")


class Flood(Tool):
    name = "flood"
    description = "Answers far too much."
    Args = EchoArgs
    max_output_chars = 100

    async def run(self, args: EchoArgs) -> str:
        return "x" * 1_000_000


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry([Echo(), Hang(), Broken(), Refuses(), Flood(), Calculator()])


async def test_valid_call_returns_output_from_json_or_dict(registry):
    from_json = await registry.call("echo", json.dumps({"text": "ab", "times": 2}), "c1")
    from_dict = await registry.call("echo", {"text": "ab"}, "c2")
    assert (from_json.output, from_json.error, from_json.call_id) == ("abab", None, "c1")
    assert (from_dict.output, from_dict.error) == ("ab", None)
    assert from_json.latency_ms >= 0


@pytest.mark.parametrize(
    "arguments, needle",
    [
        ({"times": 2}, "text"),  # missing field
        ({"text": "a", "times": 9}, "times"),  # out of range
        ('{"text": ', "invalid arguments"),  # broken JSON
        ("[1, 2]", "invalid arguments"),  # JSON but not an object
    ],
)
async def test_invalid_arguments_become_an_error_observation(registry, arguments, needle):
    result = await registry.call("echo", arguments, "c")
    assert result.error == "invalid_arguments"
    assert result.output.startswith("Error: invalid arguments for echo")
    assert needle in result.output


@pytest.mark.parametrize(
    "arguments",
    [
        "[" * 100_000 + "]" * 100_000,  # json.loads raises RecursionError
        '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "\ud800",  # a lone surrogate: JSON of nothing
    ],
)
async def test_arguments_nested_past_any_parser_depth_never_raise(registry, arguments):
    result = await registry.call("echo", arguments, "c")
    assert result.error == "invalid_arguments"
    assert len(str(result.arguments)) <= 2000  # kept, clipped, for the trajectory


async def test_deeply_nested_dict_arguments_never_raise(registry):
    nested: dict = {}
    for _ in range(10_000):
        nested = {"text": nested}
    result = await registry.call("echo", nested, "c")
    assert result.error == "invalid_arguments"
    result.model_dump_json()  # the observation serialises (the trajectory sink writes it)


async def test_unknown_tool_lists_the_available_ones(registry):
    result = await registry.call("rm_rf", {}, "c")
    assert result.error == "unknown_tool"
    assert "'rm_rf'" in result.output and "calculator" in result.output


async def test_exception_is_contained_without_leaking_its_message(registry):
    result = await registry.call("broken", {"text": "a"}, "c")
    assert result.error == "exception"
    assert "KeyError" in result.output and "secret internal detail" not in result.output


async def test_tool_error_message_reaches_the_model(registry):
    result = await registry.call("refuses", {"text": "a"}, "c")
    assert (result.error, result.output) == ("tool_error", "Error: nothing found for that text")


async def test_hanging_tool_times_out(registry):
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await registry.call("hang", {"text": "a"}, "c")
    assert result.error == "timeout" and "timed out after 0.2 s" in result.output
    assert loop.time() - start < 2.0  # the run goes on instead of waiting an hour


async def test_output_flood_is_truncated_with_a_note(registry):
    result = await registry.call("flood", {"text": "a"}, "c")
    assert result.truncated and result.error is None
    assert result.output.startswith("x" * 100)
    assert "[output truncated: 1000000 characters, showing 100]" in result.output
    assert len(result.output) < 200


async def test_calculator_errors_go_through_the_sandbox(registry):
    ok = await registry.call("calculator", '{"expression": "0.1 + 0.2"}', "c1")
    bad = await registry.call("calculator", '{"expression": "1/0"}', "c2")
    assert (ok.output, ok.error) == ("0.3", None)
    assert bad.error == "tool_error" and "division by zero" in bad.output


def test_specs_are_openai_tool_entries(registry):
    spec = {s["function"]["name"]: s for s in registry.specs()}["echo"]
    params = spec["function"]["parameters"]
    assert spec["type"] == "function" and params["required"] == ["text"]
    assert params["properties"]["times"]["maximum"] == 3


def test_duplicate_registration_is_refused(registry):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Echo())
