"""A hosted provider's OpenAI-compatible `/v1/chat/completions`, strict about its parameters.

Hosted providers answer a request field they do not know with 400 (OpenAI: "Unrecognized
request argument supplied: return_token_ids"), some refuse `logprobs` for their models, and
none knows arloop's versioned names (`gpt@champion` is a 404 `model_not_found`). This fake
does all three over real HTTP (FastAPI, served with `tests.fakes.servers.ServerThread`) and
otherwise answers like `tests.fakes.scripted_llm` without token ids or logprobs, as hosted
providers do. Every request it accepted or refused is kept for assertions.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.fakes.scripted_llm import Reply, ScriptedLLM

KNOWN = frozenset(
    "model messages tools tool_choice temperature top_p n stream stream_options stop max_tokens "
    "max_completion_tokens presence_penalty frequency_penalty seed user response_format "
    "parallel_tool_calls".split()
)
"""The request fields the fake provider takes (OpenAI's, less logprobs and top_logprobs)."""
REFUSED = frozenset({"logprobs", "top_logprobs"})
"""Known OpenAI fields this provider's models do not support (400, as several hosts answer)."""


def _error(status: int, message: str, param: str | None, code: str | None) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=status)


class StrictProvider:
    """The fake provider: `app` to serve, `served` the model names it knows, `push` replies."""

    def __init__(self, replies: list[Reply] = (), *, served: tuple[str, ...] = ("gpt-strict",)):
        self.served = served
        self.scripted = ScriptedLLM(list(replies))
        self.accepted: list[dict[str, Any]] = self.scripted.requests
        self.refused: list[dict[str, Any]] = []
        self.app = FastAPI(title="strict provider")
        self.app.post("/v1/chat/completions", response_model=None)(self._chat)

    def push(self, *replies: Reply) -> None:
        self.scripted.push(*replies)

    async def _chat(self, request: Request) -> JSONResponse | StreamingResponse:
        body = await request.json()
        refusal = self._refusal(body)
        if refusal is not None:
            self.refused.append(body)
            return refusal
        self.accepted.append(body)
        reply = self.scripted._next(body)  # noqa: SLF001 -- the scripted queue, shared
        if reply is None:
            return _error(500, "script exhausted", None, None)
        if reply.status != 200:
            return _error(reply.status, "scripted failure", None, None)
        reply.token_info = False  # hosted providers give neither token ids nor logprobs
        answer = self.scripted.render(body, reply)
        answer.pop("system_fingerprint", None)
        answer["system_fingerprint"] = "fp_hosted123"  # what OpenAI sends: not a version
        if body.get("stream"):
            chunks = self.scripted._chunks(answer, reply)  # noqa: SLF001 -- same SSE framing
            return StreamingResponse(chunks, media_type="text/event-stream")
        return JSONResponse(answer)

    def _refusal(self, body: dict[str, Any]) -> JSONResponse | None:
        for field in body:
            if field in REFUSED:
                return _error(400, f"{field} is not supported with this model.", field, None)
            if field not in KNOWN:
                message = f"Unrecognized request argument supplied: {field}"
                return _error(400, message, field, None)
        if body.get("model") not in self.served:
            message = f"The model `{body.get('model')}` does not exist or you do not have access."
            return _error(404, message, "model", "model_not_found")
        return None
