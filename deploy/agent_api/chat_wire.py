"""OpenAI's Chat Completions wire format on the agent API: the request it takes, and the pure
OpenAI bodies and chunks it answers with (the token ids the policy server adds are kept for the
trajectory, never sent on; logprobs only when the client asked for them).

A request field the policy cannot honour (one OpenAI defines that arloop's policy server does
not implement, or any unknown one) is a 400 naming it, never dropped; so are wrong types, NaN
or Infinity, nesting deeper than `MAX_DEPTH` (the app's error handler answers these routes in
OpenAI's shape). Bodies over ARLOOP_MAX_BODY_BYTES are a 413.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from agents.errors import ArloopError
from deploy.credentials import USER

MAX_DEPTH = 32
"""The deepest nesting a request's JSON may have (OpenAI tool schemas need about 10)."""
MODEL = "arloop"
"""The model name that routes like the agents' own calls; `arloop@<version>` pins one."""
_PINNED = re.compile(r"^arloop@([A-Za-z0-9_.-]{1,64})$")


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


class _Wire(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class TextPart(_Wire):
    type: Literal["text"]
    text: str


class FunctionCall(_Wire):
    name: str
    arguments: str = "{}"


class ToolCall(_Wire):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class _Message(_Wire):
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


def _integral(value: Any) -> Any:
    """JSON's 7.0 is the integer 7 (as JSON Schema reads it); 7.5 and "7" stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_Integral = BeforeValidator(_integral)
Tokens = Annotated[int, Field(ge=1), _Integral]
Seed = Annotated[int, Field(ge=-(2**53), le=2**53), _Integral]
Choices = Annotated[int, Field(ge=1, le=16), _Integral]
TopLogprobs = Annotated[int, Field(ge=0, le=20), _Integral]


class FunctionSpec(_Wire):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: dict[str, str]


class StreamOptions(_Wire):
    include_usage: bool = False


Stop = Annotated[str, StringConstraints(min_length=1)]
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class ChatCompletionRequest(_Wire):
    """`POST /v1/chat/completions`: the OpenAI fields arloop's policy server implements,
    passed through; any other field is a 400 naming it."""

    model: str = Field(examples=["arloop", "arloop@v3"])
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    stop: Stop | Annotated[list[Stop], Field(max_length=4)] | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: Annotated[dict[TokenId, Bias], Field(max_length=300)] | None = None
    seed: Seed | None = None
    """Within +-2**53, which every JSON reader keeps exact (the schema's int64 bounds were not)."""
    n: Choices | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, pattern=USER)
    """The end user (else `X-Arloop-User`, else the API key): bound by the key's identity."""

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        check_plain(data)
        return data

    @property
    def pinned(self) -> str | None:
        """The version `arloop@<version>` names (None for plain `arloop`); 404 for another model."""
        if self.model == MODEL:
            return None
        match = _PINNED.match(self.model)
        if match is None:
            raise OpenAIError(
                404,
                f"the model {self.model[:80]!r} does not exist here: ask for 'arloop' (the "
                "champion, or this run's canary arm) or 'arloop@<version>' (e.g. arloop@v3)",
                param="model",
                code="model_not_found",
            )
        return match.group(1)

    def completion_tokens(self, default: int | None) -> int:
        """The completion tokens this request may ask for (n choices of max_tokens)."""
        most = self.max_completion_tokens or self.max_tokens or default or 512
        return (self.n or 1) * most

    def upstream(self) -> dict[str, Any]:
        """The request as the policy is sent it: the fields the client set, less the end user
        (a person's id is the agent API's to bind, never the model server's to log)."""
        out = self.model_dump(exclude_unset=True, exclude={"model", "user"}, exclude_none=True)
        out["messages"] = self.messages_sent()
        return out

    def messages_sent(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def tools_sent(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]


def check_plain(value: Any, path: str = "", depth: int = 0) -> None:
    """Refuse what no model server takes, wherever it is: nesting deeper than `MAX_DEPTH`,
    NaN or Infinity, lone surrogates."""
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
        children: Any = value.items()
    elif isinstance(value, list):
        children = enumerate(value)
    else:
        return
    for key, item in children:
        check_plain(item, f"{path}.{key}" if path else str(key), depth + 1)


def error_param(loc: tuple[Any, ...]) -> str:
    """`messages.0.role` from pydantic's location, without 'body' and union branch names."""
    kept = [
        str(p)
        for p in loc
        if p != "body" and (isinstance(p, int) or (str(p).isidentifier() and p not in _TYPE_NAMES))
    ]
    return ".".join(kept) or "body"


_SURROGATE = re.compile("[\ud800-\udfff]")
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}


# -- answers: agents.openai_answers (shared with the gate's recording endpoint) -------------
