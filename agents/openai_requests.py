"""OpenAI's Chat Completions request, as arloop's two OpenAI endpoints take it: the messages of
each role, content parts, tool calls, tools, `tool_choice`, `response_format`, stream options,
and the checks every body passes (no NaN, no lone surrogates, bounded nesting).

One copy for the agent API (`deploy/agent_api/chat_wire.py`) and the policy server
(`deploy/policy_server/openai_wire.py`): each subclasses `ChatRequestBase` with its own
sampling fields and bounds (the agent API's are what a client may ask of any policy, the
policy server's what its engine implements). A part that does not fit, or a key no part of
its kind declares, is a 400 naming the field on both.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.errors import ArloopError

MAX_DEPTH = 32
"""The deepest nesting a request's JSON may have (OpenAI tool schemas need about 10)."""
ROLES = ("system", "developer", "user", "assistant", "tool")


class OpenAIError(ArloopError):
    """An error with OpenAI's `param` (the request field at fault) and `code`."""

    def __init__(
        self, status: int, reason: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(status, reason)
        self.param, self.code = param, code


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error of the OpenAI routes, in OpenAI's shape."""

    error: ErrorDetail


class Wire(BaseModel):
    """A request part: strict, as its JSON schema says (`"true"` is not a boolean), and any
    field it does not declare refused."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class TextPart(Wire):
    type: Literal["text"]
    text: str


class FunctionCall(Wire):
    name: str
    arguments: str = "{}"


class ToolCall(Wire):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(Wire):
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_of_echoed_messages(cls, data: Any) -> Any:
        """An assistant message the SDK echoes back carries `refusal: null`, `audio: null`, ...:
        those nulls say nothing; a field of the sort with a value is refused (extra)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in cls.model_fields}
        return data


Content = str | list[TextPart]


class SystemMessage(_Message):
    role: Literal["system", "developer"]
    content: Content


class UserMessage(_Message):
    role: Literal["user"]
    content: Content


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionSpec(Wire):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Wire):
    type: Literal["function"]
    function: FunctionSpec


class FunctionName(Wire):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(Wire):
    """`{"type": "function", "function": {"name": ...}}`: that function must be called."""

    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(Wire):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(Wire):
    """`text`, `json_object` (any JSON object) or `json_schema` (one matching the schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Wire):
    include_usage: bool = False


class ChatRequestBase(Wire):
    """`POST /v1/chat/completions`, less the sampling fields whose bounds each endpoint sets in
    its subclass; every body is checked by `check_plain` and `check_roles` first."""

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        check_plain(data)
        check_roles(data)
        return data


def check_plain(value: Any, path: str = "", depth: int = 0) -> None:
    """Refuse what no model server takes, wherever it is (keys too): nesting deeper than
    `MAX_DEPTH`, NaN or Infinity, lone surrogates."""
    if depth > MAX_DEPTH:
        raise OpenAIError(
            400, f"the request nests deeper than {MAX_DEPTH} levels at {path}", param=path
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise OpenAIError(400, f"{path} is {value}: send finite numbers", param=path)
    if isinstance(value, str) and _SURROGATE.search(value):
        raise OpenAIError(
            400, f"{path} holds a lone UTF-16 surrogate, which is not text", param=path
        )
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, path, depth + 1)
            check_plain(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_plain(item, f"{path}.{i}" if path else str(i), depth + 1)


def check_roles(data: Any) -> None:
    """A message without a role, or with one OpenAI does not define, is a 400 naming its
    `role` (pydantic would name only the message)."""
    messages = data.get("messages") if isinstance(data, dict) else None
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") not in ROLES:
            raise OpenAIError(
                400,
                f"messages.{i}.role is {str(message.get('role'))[:40]!r}: a message's role is "
                f"one of {', '.join(ROLES)}",
                param=f"messages.{i}.role",
            )


def error_param(loc: tuple[Any, ...]) -> str:
    """`messages.0.content.0.type` from pydantic's location, without 'body', union branch
    names and the role tag of a message's branch."""
    kept: list[str] = []
    for i, p in enumerate(loc):
        if isinstance(p, int) or (isinstance(p, str) and p.isdigit()):
            kept.append(str(p))
        elif p == "body" or not str(p).isidentifier() or p in _TYPE_NAMES:
            continue
        elif p in ROLES and i >= 2 and loc[i - 2] == "messages":
            continue  # messages.0.user.content: the tag of the union's branch
        elif str(p)[:1].isupper():
            continue  # tool_choice.NamedToolChoice.function: a model branch of a union
        else:
            kept.append(str(p))
    return ".".join(kept) or "body"


_SURROGATE = re.compile("[\ud800-\udfff]")
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}
