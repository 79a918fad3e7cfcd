"""litellm's answers as OpenAI's Chat Completions bodies, nothing arloop's added: what the agent
API's `/v1/chat/completions` (`deploy.agent_api.chat_completions`) and the gate's recording
endpoint for a team's agent (`deploy.learn.eval_endpoint`) both send back."""

from __future__ import annotations

from typing import Any


def completion_body(response: Any, model: str, logprobs: bool) -> dict[str, Any]:
    """litellm's `ModelResponse` as OpenAI's `chat.completion`, nothing arloop's added."""
    choices = []
    for choice in response.choices:
        message = choice.message
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        calls = _calls(message.tool_calls)
        if calls:
            out["tool_calls"] = calls
        choices.append(
            {
                "index": choice.index,
                "message": out,
                "finish_reason": choice.finish_reason,
                "logprobs": _logprobs(getattr(choice, "logprobs", None)) if logprobs else None,
            }
        )
    return {
        "id": response.id,
        "object": "chat.completion",
        "created": response.created,
        "model": model,
        "system_fingerprint": getattr(response, "system_fingerprint", None),
        "choices": choices,
        "usage": _usage(getattr(response, "usage", None)),
    }


def chunk_body(chunk: Any, model: str, logprobs: bool) -> dict[str, Any]:
    """One litellm stream chunk as OpenAI's `chat.completion.chunk`."""
    choices = []
    for choice in chunk.choices:
        delta = choice.delta
        out: dict[str, Any] = {}
        if getattr(delta, "role", None):
            out["role"] = delta.role
        if getattr(delta, "content", None) is not None:
            out["content"] = delta.content
        calls = _calls(getattr(delta, "tool_calls", None), deltas=True)
        if calls:
            out["tool_calls"] = calls
        entry = {"index": choice.index, "delta": out, "finish_reason": choice.finish_reason}
        entry["logprobs"] = _logprobs(getattr(choice, "logprobs", None)) if logprobs else None
        choices.append(entry)
    body = {
        "id": chunk.id,
        "object": "chat.completion.chunk",
        "created": chunk.created,
        "model": model,
        "system_fingerprint": getattr(chunk, "system_fingerprint", None),
        "choices": choices,
    }
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        body["usage"] = _usage(usage)
    return body


def _calls(calls: Any, deltas: bool = False) -> list[dict[str, Any]]:
    out = []
    for n, call in enumerate(calls or []):
        function = call.function
        entry = {
            "id": call.id,
            "type": "function",
            "function": {"name": function.name, "arguments": function.arguments},
        }
        if deltas:
            entry["index"] = getattr(call, "index", None) or n
        out.append(entry)
    return out


def _logprobs(logprobs: Any) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = logprobs.get("content") if isinstance(logprobs, dict) else logprobs.content
    entries = []
    for t in content or []:
        t = t if isinstance(t, dict) else t.model_dump()
        tops = [
            {"token": p["token"], "logprob": p["logprob"], "bytes": p.get("bytes")}
            for p in (t.get("top_logprobs") or [])
        ]
        entries.append(
            {
                "token": t["token"],
                "logprob": t["logprob"],
                "bytes": t.get("bytes"),
                "top_logprobs": tops,
            }
        )
    return {"content": entries}


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
