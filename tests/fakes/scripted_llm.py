"""A scripted OpenAI-compatible `/v1/chat/completions` served over real HTTP.

Answers come from a queue of `Reply`s (then from an optional responder function), each with
token ids, per-token logprobs and a `system_fingerprint`, the way arloop's policy server and
vLLM (`return_token_ids`) answer. Every request and response is kept for assertions. A
request with `stream: true` gets the same answer as server-sent chunks, one per token (as the
policy server sends them: prompt token ids first, token ids and logprobs per chunk, tool
calls whole at the end).

Run alone (benchmarks): `python -m tests.fakes.scripted_llm --port 8101 --tool-steps 3`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

DEFAULT_FINGERPRINT = "fake-v0"


@dataclass
class Reply:
    """One scripted answer: text, tool calls `(name, arguments JSON)`, or an HTTP error."""

    content: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    fingerprint: str | None = None  # None: from the model name; "": leave the field out
    status: int = 200
    delay_s: float = 0.0
    token_info: bool = True  # False: no token ids or logprobs, like most hosted providers
    chunk_delay_s: float = 0.0  # streamed: the pause before each token's chunk
    break_after: int | None = None  # streamed: drop the connection after this many tokens


def token_ids(text: str) -> list[int]:
    """Deterministic fake token ids: one per word or space."""
    return [zlib.crc32(piece.encode()) % 50_000 for piece in re.findall(r"\S+|\s", text)]


def fake_logprob(token_id: int) -> float:
    return -((token_id % 997) + 1) / 1000


def completion_text(reply: Reply) -> str:
    """What the model 'wrote': the text, or Hermes-style tool calls."""
    calls = [
        f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'
        for name, args in reply.tool_calls
    ]
    return "".join(calls) or (reply.content or "")


class ScriptedLLM:
    """The endpoint's script and its log; `app` is the ASGI app to serve."""

    def __init__(
        self,
        replies: list[Reply] = (),
        *,
        responder: Callable[[dict[str, Any]], Reply] | None = None,
        fingerprints: dict[str, str] | None = None,
    ) -> None:
        self.queue: deque[Reply] = deque(replies)
        self.responder = responder
        self.fingerprints = fingerprints or {}
        self.requests: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        self.heads: dict[str, Callable[[dict[str, Any]], Any]] = {}
        """A decision head per name (`POST /v1/heads/{name}`): request -> label; None or no
        head of that name: 404, as arloop's policy server answers for a version without one;
        anything else than a label: that JSON body as it is."""
        self.head_requests: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/heads/{name}", self._head, methods=["POST"]),
            ]
        )

    def push(self, *replies: Reply) -> None:
        self.queue.extend(replies)

    def _next(self, request: dict[str, Any]) -> Reply | None:
        if self.queue:
            return self.queue.popleft()
        return self.responder(request) if self.responder else None

    async def _head(self, http: Request) -> JSONResponse:
        request = await http.json()
        name = http.path_params["name"]
        self.head_requests.append({"name": name, **request})
        head = self.heads.get(name)
        label = head(request) if head else None
        if label is None:
            return JSONResponse({"error": {"message": f"no fitted head {name!r}"}}, status_code=404)
        if not isinstance(label, str):  # a body as given: a head endpoint gone wrong
            return JSONResponse(label)
        version = request["model"].partition("@")[2] or "champion"
        return JSONResponse({"label": label, "probability": 0.75, "version": version})

    async def _chat(self, http: Request) -> JSONResponse:
        request = await http.json()
        self.requests.append(request)
        reply = self._next(request)
        if reply is None:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=500)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return JSONResponse({"error": {"message": "scripted failure"}}, reply.status)
        body = self.render(request, reply)
        self.responses.append(body)
        if request.get("stream"):
            return StreamingResponse(self._chunks(body, reply), media_type="text/event-stream")
        return JSONResponse(body)

    async def _chunks(self, body: dict[str, Any], reply: Reply):
        """The body as `chat.completion.chunk` events; `reply` paces or breaks the stream."""
        base = {k: body[k] for k in ("id", "created", "model") if k in body}
        base |= {"object": "chat.completion.chunk"}
        if "system_fingerprint" in body:
            base["system_fingerprint"] = body["system_fingerprint"]
        choice = body["choices"][0]
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        extra = {"prompt_token_ids": body["prompt_token_ids"]} if "prompt_token_ids" in body else {}
        yield _sse(base | {"choices": [first]} | extra)
        text = choice["message"]["content"] or ""
        pieces = re.findall(r"\S+|\s", text)
        ids = choice.get("token_ids") or []
        for n, piece in enumerate(pieces):
            if reply.break_after is not None and n >= reply.break_after:
                raise ConnectionError("scripted: the stream breaks here")
            if reply.chunk_delay_s:
                await asyncio.sleep(reply.chunk_delay_s)
            delta: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            if n < len(ids):
                delta["token_ids"] = [ids[n]]
                delta["logprobs"] = {"content": [choice["logprobs"]["content"][n]]}
            yield _sse(base | {"choices": [delta]})
        if len(ids) > len(pieces):  # a call's tokens: no visible text, still logged
            rest = {"index": 0, "delta": {}, "finish_reason": None, "token_ids": ids[len(pieces) :]}
            rest["logprobs"] = {"content": choice["logprobs"]["content"][len(pieces) :]}
            yield _sse(base | {"choices": [rest]})
        calls = choice["message"].get("tool_calls") or []
        if calls:
            deltas = [{"index": k, **c} for k, c in enumerate(calls)]
            yield _sse(base | {"choices": [{"index": 0, "delta": {"tool_calls": deltas}}]})
        end = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
        yield _sse(base | {"choices": [end]})
        yield "data: [DONE]\n\n"

    def render(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The chat.completion body for one scripted reply."""
        n = len(self.responses)
        text = completion_text(reply)
        ids = token_ids(text)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{n}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for i, (name, args) in enumerate(reply.tool_calls)
            ]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            "token_ids": ids,
            "logprobs": {
                "content": [
                    {"token": str(t), "logprob": fake_logprob(t), "bytes": None, "top_logprobs": []}
                    for t in ids
                ]
            },
        }
        prompt_ids = token_ids(json.dumps(request.get("messages", [])))
        body = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fake"),
            "prompt_token_ids": prompt_ids,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
            },
        }
        if not reply.token_info:
            del body["prompt_token_ids"], choice["token_ids"], choice["logprobs"]
        fingerprint = reply.fingerprint
        if fingerprint is None:
            fingerprint = self.fingerprints.get(body["model"], DEFAULT_FINGERPRINT)
        if fingerprint:
            body["system_fingerprint"] = fingerprint
        return body


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def tool_loop_responder(tool: str, arguments: str, steps: int) -> Callable[[dict], Reply]:
    """Call `tool` `steps` times after the last user message, then answer."""

    def respond(request: dict[str, Any]) -> Reply:
        messages = request.get("messages", [])
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        done = sum(1 for m in messages[last_user:] if m.get("role") == "tool")
        if done < steps:
            return Reply(tool_calls=[(tool, arguments)])
        return Reply(content=f"Done after {done} tool calls.")

    return respond


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tool", default="calculator")
    parser.add_argument("--arguments", default='{"expression": "2+3"}')
    parser.add_argument("--tool-steps", type=int, default=3)
    opts = parser.parse_args()
    llm = ScriptedLLM(responder=tool_loop_responder(opts.tool, opts.arguments, opts.tool_steps))
    uvicorn.run(
        llm.app,
        host="127.0.0.1",
        port=opts.port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        access_log=False,
    )


if __name__ == "__main__":
    main()
