"""Server-sent events in OpenAI's `chat.completion.chunk` format, one choice at a time."""

from __future__ import annotations

import json
import time
from typing import Any

from deploy.policy_server.openai_wire import ChatRequest, logprobs_content, message_of
from learner.policy.chat_format import ToolFormat, visible_len
from learner.policy.generation.engine import FinishEvent, TokenEvent


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n"


class ChunkWriter:
    """Wraps choice deltas in chunk envelopes that share the response id and version."""

    def __init__(self, req: ChatRequest, request_id: str, version: str) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model,
            "system_fingerprint": version,
        }

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse({**self.base, "choices": choices, **extra})


class ChoiceStream:
    """One choice's deltas: text as it becomes safe, tool calls parsed at the end."""

    def __init__(
        self, req: ChatRequest, index: int, tokenizer: Any, tool_format: ToolFormat = "hermes"
    ) -> None:
        self.req, self.index, self.tokenizer = req, index, tokenizer
        self.tools = req.plain_tools()
        self.tool_format = tool_format
        self.text = ""  # text the engine has released so far
        self.sent = 0  # characters of it sent as content

    def first(self) -> dict[str, Any]:
        return self._choice({"role": "assistant", "content": ""})

    def on_token(self, ev: TokenEvent) -> dict[str, Any] | None:
        """The delta for one token, or None when there is nothing to send yet."""
        self.text += ev.text
        visible = self.text[: self._visible_len()]
        delta = {"content": visible[self.sent :]} if len(visible) > self.sent else {}
        self.sent = max(self.sent, len(visible))
        choice = self._choice(delta)
        if self.req.logprobs:
            entries = logprobs_content(
                self.tokenizer, [ev.token_id], [ev.logprob], [ev.top] if ev.top is not None else []
            )
            choice["logprobs"] = {"content": entries}
        if self.req.return_token_ids:
            choice["token_ids"] = [ev.token_id]
        if delta or self.req.logprobs or self.req.return_token_ids:
            return choice
        return None

    def on_finish(self, ev: FinishEvent) -> list[dict[str, Any]]:
        """The rest of the content, the tool calls if any, then the finish reason."""
        message, reason = message_of(ev, self.tools, self.tool_format, self.req.parallel_tool_calls)
        content = message["content"] or ""
        out = []
        if len(content) > self.sent and content.startswith(self.text[: self.sent]):
            out.append(self._choice({"content": content[self.sent :]}))
        for k, call in enumerate(message.get("tool_calls") or []):
            out.extend(self._choice({"tool_calls": [d]}) for d in call_deltas(k, call))
        out.append(self._choice({}, finish_reason=reason))
        return out

    def _visible_len(self) -> int:
        """With tools, hold back from a (possibly partial) call and trailing space."""
        if not self.tools:
            return len(self.text)
        return visible_len(self.text, self.tool_format)

    def _choice(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "index": self.index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }


def call_deltas(index: int, call: dict[str, Any], piece: int = 16) -> list[dict[str, Any]]:
    """One tool call as OpenAI streams it: id, type and name with empty arguments, then the
    arguments in pieces (a client concatenates them)."""
    args = call["function"]["arguments"]
    head = {
        "index": index,
        "id": call["id"],
        "type": "function",
        "function": {"name": call["function"]["name"], "arguments": ""},
    }
    rest = [
        {"index": index, "function": {"arguments": args[i : i + piece]}}
        for i in range(0, len(args), piece)
    ]
    return [head, *rest]
