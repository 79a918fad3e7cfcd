"""OpenAI's Chat Completions wire format on the agent API: the request it takes, and the pure
OpenAI bodies and chunks it answers with (the token ids the policy server adds are kept for the
trajectory, never sent on; logprobs only when the client asked for them).

A request field the policy cannot honour (one OpenAI defines that arloop's policy server does
not implement, or any unknown one) is a 400 naming it, never dropped; so are wrong types, NaN
or Infinity, nesting deeper than `MAX_DEPTH` (the app's error handler answers these routes in
OpenAI's shape). Bodies over ARLOOP_MAX_BODY_BYTES are a 413. The messages, tools and formats
are `agents.openai_requests`' (shared with the policy server); the bounds here are the agent
API's.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PrivateAttr, StringConstraints

from agents.openai_requests import ChatRequestBase
from agents.openai_requests import ErrorBody as ErrorBody  # re-exported: the routes' errors
from agents.openai_requests import OpenAIError as OpenAIError
from agents.openai_requests import error_param as error_param
from deploy.credentials import USER

MODEL = "arloop"
"""The model name that routes like the agents' own calls; `arloop@<version>` pins one."""
_PINNED = re.compile(r"^arloop@([A-Za-z0-9_.-]{1,64})$")


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
Stop = Annotated[str, StringConstraints(min_length=1)]
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class ChatCompletionRequest(ChatRequestBase):
    """`POST /v1/chat/completions`: the OpenAI fields arloop's policy server implements,
    passed through; any other field is a 400 naming it."""

    model: str = Field(examples=["arloop", "arloop@v3"])
    parallel_tool_calls: bool | None = None
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
    user: str | None = Field(None, pattern=USER)
    """The end user (else `X-Arloop-User`, else the API key): bound by the key's identity."""
    _sent: list[dict[str, Any]] | None = PrivateAttr(None)

    def send_messages(self, messages: list[dict[str, Any]] | None) -> None:
        """Send the policy (and record) `messages` instead of the client's (scrubbed ones)."""
        self._sent = messages

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
        out = self.model_dump(
            exclude_unset=True, exclude={"model", "user"}, exclude_none=True, by_alias=True
        )
        out["messages"] = self.messages_sent()
        return out

    def messages_sent(self) -> list[dict[str, Any]]:
        if self._sent is not None:
            return self._sent
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def tools_sent(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]


# -- answers: agents.openai_answers (shared with the gate's recording endpoint) -------------
