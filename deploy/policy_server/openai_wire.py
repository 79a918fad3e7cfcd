"""The OpenAI chat-completions wire format: request schema, errors, and response bodies."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agents.errors import ArloopError
from deploy.settings import PolicyServerSettings
from learner.policy.chat_format import (
    ChatFormatError,
    ToolFormat,
    call_stop_pattern,
    parse_tool_calls,
    prompt_token_ids,
    resolve_tool_format,
)
from learner.policy.generation.engine import FinishEvent, SamplingParams
from learner.policy.registry import CHAMPION

Role = Literal["system", "developer", "user", "assistant", "tool"]


class OpenAIError(ArloopError):
    """An ArloopError with OpenAI's `param` (the request field at fault) and `code`."""

    def __init__(
        self, status: int, reason: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(status, reason)
        self.param, self.code = param, code


def error_body(exc: ArloopError) -> dict[str, Any]:
    """Any ArloopError in OpenAI's shape: {"error": {message, type, param, code}}."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    param, code = getattr(exc, "param", None), getattr(exc, "code", None)
    return {"error": {"message": exc.reason, "type": kind, "param": param, "code": code}}


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """POST /v1/chat/completions. Unknown OpenAI fields are ignored, as most servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = Field(None, validate_default=True)
    include_stop_str_in_output: bool = False
    """vLLM's extension: the stop string that ended a choice stays in its text."""
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """OpenAI's: minus this times each token's count so far in the completion, per logit."""
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """OpenAI's: minus this once a token has appeared in the completion, per logit."""
    seed: int | None = None
    n: int = Field(1, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    """vLLM's extension: `prompt_token_ids` at the top, `token_ids` on each choice."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    def plain_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def plain_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


def error_param(loc: tuple[Any, ...]) -> str:
    """`messages.0.role` from pydantic's location, without 'body' and union branch names."""
    parts = [str(p) for p in loc if p != "body"]
    kept = [p for p in parts if p.isdigit() or (p.isidentifier() and p not in _TYPE_NAMES)]
    return ".".join(kept) or "body"


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def logprobs_content(
    tokenizer: Any, token_ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]]
) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content`: one entry per token, with its alternatives."""
    entries = []
    for i, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        entry = {**_token(tokenizer, tid), "logprob": lp, "top_logprobs": []}
        if i < len(tops):
            entry["top_logprobs"] = [{**_token(tokenizer, t), "logprob": v} for t, v in tops[i]]
        entries.append(entry)
    return entries


def _token(tokenizer: Any, token_id: int) -> dict[str, Any]:
    raw = token_bytes(tokenizer, token_id)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # a piece of a multi-byte character, written as OpenAI does
        text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return {"token": text, "bytes": list(raw)}


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes a token stands for (byte-level BPE symbols mapped back to bytes)."""
    symbol = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(symbol, str) and all(ch in _BYTE_DECODER for ch in symbol):
        return bytes(_BYTE_DECODER[ch] for ch in symbol)
    return tokenizer.decode([token_id]).encode("utf-8")


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-ins byte-level BPE uses."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_DECODER = _byte_decoder()


def tool_format_of(settings: PolicyServerSettings) -> ToolFormat:
    """The server's tool-call format (`auto` resolved for its base model)."""
    return resolve_tool_format(settings.tool_format, settings.base_model)


def message_of(
    finish: FinishEvent, tools: list[dict[str, Any]] | None, tool_format: ToolFormat
) -> tuple[dict[str, Any], str]:
    """(assistant message, finish_reason): tool calls parsed out when the request had tools."""
    content, calls = (
        parse_tool_calls(finish.text, tools, tool_format) if tools else (finish.text, [])
    )
    message: dict[str, Any] = {"role": "assistant", "content": content}
    reason = finish.finish_reason
    if calls:
        message["tool_calls"] = calls
        reason = "tool_calls" if reason == "stop" else reason
    return message, reason


def completion_body(
    req: ChatRequest,
    *,
    request_id: str,
    version: str,
    tokenizer: Any,
    prompt_ids: list[int],
    finishes: list[FinishEvent],
    tool_format: ToolFormat = "hermes",
    engine: str | None = None,
) -> dict[str, Any]:
    """The non-streaming response body; `engine` names the numerics behind its logprobs."""
    choices = []
    for f in sorted(finishes, key=lambda f: f.index):
        message, reason = message_of(f, req.plain_tools(), tool_format)
        choice: dict[str, Any] = {
            "index": f.index,
            "message": message,
            "finish_reason": reason,
            "logprobs": None,
        }
        if req.logprobs:
            choice["logprobs"] = {
                "content": logprobs_content(tokenizer, f.token_ids, f.logprobs, f.tops)
            }
        if req.return_token_ids:
            choice["token_ids"] = f.token_ids
        choices.append(choice)
    completion = sum(len(f.token_ids) for f in finishes)
    body = {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": version,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(prompt_ids) + completion,
        },
    }
    if engine is not None:
        body["engine"] = engine
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


def target_of(model: str, served: str) -> str:
    """The alias or version a model string names: `arloop` -> champion, `arloop@v3` -> v3."""
    name, _, which = model.partition("@")
    if name != served or (model.endswith("@") and not which):
        raise OpenAIError(
            404,
            f"model {model!r} does not exist; this server serves {served!r}, "
            f"'{served}@candidate' and '{served}@v<N>'",
            param="model",
            code="model_not_found",
        )
    return which or CHAMPION


def prepare(
    req: ChatRequest, tokenizer: Any, context: int, settings: PolicyServerSettings
) -> tuple[list[int], list[SamplingParams]]:
    """Prompt token ids and one SamplingParams per sample, or a 400 naming the field.

    `max_tokens` above `max_tokens_cap`, or beyond what the context leaves, is clamped (as
    vLLM does); unset means "up to the cap".
    """
    if req.top_logprobs and not req.logprobs:
        raise OpenAIError(400, "top_logprobs requires logprobs: true", param="top_logprobs")
    if req.n > settings.max_n:
        raise OpenAIError(
            400,
            f"n is {req.n}; this server samples at most {settings.max_n} choices per request",
            param="n",
        )
    fmt = tool_format_of(settings)
    try:
        prompt_ids = prompt_token_ids(tokenizer, req.plain_messages(), req.plain_tools(), fmt)
    except ChatFormatError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
    room = context - len(prompt_ids)
    if room < 1:
        raise OpenAIError(
            400,
            f"the prompt is {len(prompt_ids)} tokens; this model's context is {context} tokens "
            "(prompt plus completion)",
            param="messages",
            code="context_length_exceeded",
        )
    asked = req.max_completion_tokens or req.max_tokens or settings.max_tokens_cap
    max_tokens = min(asked, settings.max_tokens_cap, room)
    sampling = SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        max_tokens=max_tokens,
        stop=tuple(req.stop),
        include_stop=req.include_stop_str_in_output,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        seed=req.seed,
        top_logprobs=req.top_logprobs or 0,
        stop_line=call_stop_pattern(req.plain_tools(), fmt),
    )
    return prompt_ids, [sampling] * req.n
