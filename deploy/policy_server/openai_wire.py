"""The OpenAI chat-completions wire format: request schema, errors, and response bodies. The
messages, tools and formats are `agents.openai_requests`' (shared with the agent API); the
sampling fields and their bounds here are what this server's engine implements."""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field, field_validator

from agents.errors import ArloopError
from agents.openai_requests import ChatRequestBase, ErrorBody
from agents.openai_requests import OpenAIError as OpenAIError  # re-exported: its errors
from agents.openai_requests import error_param as error_param
from deploy.policy_server.settings import PolicyServerSettings
from learner.policy.chat_format import (
    ToolFormat,
    parse_tool_calls,
    resolve_tool_format,
)
from learner.policy.generation.engine import FinishEvent


def error_body(exc: ArloopError) -> dict[str, Any]:
    """Any ArloopError in OpenAI's shape: {"error": {message, type, param, code}}."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    param, code = getattr(exc, "param", None), getattr(exc, "code", None)
    return {"error": {"message": exc.reason, "type": kind, "param": param, "code": code}}


_WHY = {
    400: "A parameter is invalid or not supported (`param` names it).",
    401: "No API key, or not one of ARLOOP_POLICY_KEYS.",
    403: "The version was rejected by the eval gate (only the gate's key samples it).",
    404: "No such model name or version.",
    413: "The body is over ARLOOP_POLICY_MAX_BODY_BYTES.",
    429: "The key's completion tokens a minute are spent (Retry-After says when).",
    500: "Generation failed.",
    503: "Busy (`queue_full`, `queue_timeout`) or `shutting_down`: Retry-After says when to retry.",
}


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses (schemathesis checks the answers)."""
    return {code: {"model": ErrorBody, "description": _WHY[code]} for code in codes}


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class ChatRequest(ChatRequestBase):
    """POST /v1/chat/completions. A parameter this server does not implement is a 400 naming it
    (see the README's compatibility table), never silently ignored. Strict: `"true"` is not a
    boolean, `"2"` not a number."""

    model: str = Field(examples=["arloop", "arloop@candidate", "arloop@v0"])
    parallel_tool_calls: bool = True
    """false: at most one tool call per choice (generation stops after the first)."""
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
    logit_bias: dict[str, float] | None = None
    """OpenAI's: token id (a string) -> bias in [-100, 100] added to its logit."""
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    return_token_ids: bool = False
    """vLLM's extension: `prompt_token_ids` at the top, `token_ids` on each choice."""
    user: str | None = Field(None, max_length=256)
    """OpenAI's end-user id (abuse tracking): on the request's debug log line."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not token.isdigit() or len(token) > 9:
                raise ValueError(f"logit_bias keys are token ids, got {token[:20]!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values are in [-100, 100], got {bias} for {token}")
        if v and len(v) > 300:
            raise ValueError("logit_bias takes at most 300 tokens")
        return v

    def plain_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def plain_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


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
    finish: FinishEvent,
    tools: list[dict[str, Any]] | None,
    tool_format: ToolFormat,
    parallel: bool = True,
) -> tuple[dict[str, Any], str]:
    """(assistant message, finish_reason): tool calls parsed out when the request had tools
    (only the first unless `parallel`)."""
    content, calls = (
        parse_tool_calls(finish.text, tools, tool_format) if tools else (finish.text, [])
    )
    calls = calls if parallel else calls[:1]
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
        message, reason = message_of(f, req.plain_tools(), tool_format, req.parallel_tool_calls)
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
