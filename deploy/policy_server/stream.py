"""Server-sent events in OpenAI's `chat.completion.chunk` format, one choice at a time."""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Any

from deploy.policy_server.openai_wire import ChatRequest, logprobs_content, message_of
from learner.policy.chat_format import CALL_CLOSE, CALL_OPEN, ToolFormat, visible_len
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
    """One choice's deltas: text as it becomes safe; tool calls parsed at the end, or, when
    the request forces them (a grammar guarantees they parse), their arguments as they come."""

    def __init__(
        self, req: ChatRequest, index: int, tokenizer: Any, tool_format: ToolFormat = "hermes"
    ) -> None:
        self.req, self.index, self.tokenizer = req, index, tokenizer
        self.tools = req.plain_tools()
        self.tool_format = tool_format
        self.text = ""  # text the engine has released so far
        self.sent = 0  # characters of it sent as content
        forced = req.tool_choice == "required" or not isinstance(req.tool_choice, str | None)
        self.live = LiveCalls() if forced and tool_format == "hermes" and self.tools else None

    def first(self) -> dict[str, Any]:
        return self._choice({"role": "assistant", "content": ""})

    def on_token(self, ev: TokenEvent) -> list[dict[str, Any]]:
        """The deltas for one token (none when there is nothing to send yet)."""
        choice = self._token_choice(ev)
        out = [choice] if choice is not None else []
        if self.live is not None:
            out += [self._choice({"tool_calls": [d]}) for d in self.live.deltas(self.text)]
        return out

    def _token_choice(self, ev: TokenEvent) -> dict[str, Any] | None:
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
        calls = message.get("tool_calls") or []
        if self.live is not None:  # the rest of the calls streamed so far, then any others
            out += [self._choice({"tool_calls": [d]}) for d in self.live.deltas(ev.text)]
            calls = calls[self.live.started :]
        for k, call in enumerate(calls, start=self.live.started if self.live else 0):
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


class LiveCalls:
    """Hermes calls streamed as the model writes them: `<tool_call>{"name": "x", "arguments": `
    sends the call's id and name, then its arguments follow, held back only where they could
    be the call's closing `}</tool_call>`. Only for calls a grammar forces: they always parse,
    and the arguments sent are the text the non-streamed answer parses (`, ` and `: `, as
    `json.dumps` writes them)."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # per call: characters of its arguments sent

    @property
    def started(self) -> int:
        return len(self.sent)

    def deltas(self, text: str) -> list[dict[str, Any]]:
        out = []
        for k, head in enumerate(_CALL_HEAD.finditer(text)):
            if k == len(self.sent):
                self.sent.append(0)
                out.append(_head(k, head.group(1)))
            close = text.find(CALL_CLOSE, head.end())
            args = text[head.end() : close if close >= 0 else len(text)]
            if close >= 0:
                args = args.rstrip().removesuffix("}")
            else:
                args = args[: len(args) - _partial(args, "}" + CALL_CLOSE)]
            if len(args) > self.sent[k]:
                out.append({"index": k, "function": {"arguments": args[self.sent[k] :]}})
                self.sent[k] = len(args)
        return out


_CALL_HEAD = re.compile(re.escape(CALL_OPEN) + r'\{"name": "([^"]+)", "arguments": ')


def _partial(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for k in range(min(len(marker), len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _head(index: int, name: str) -> dict[str, Any]:
    return {
        "index": index,
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": name, "arguments": ""},
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
