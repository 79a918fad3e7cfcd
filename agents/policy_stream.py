"""A streamed chat completion, put together as it arrives.

Each text delta goes to a callback at once (the agent API forwards it to its client); at the
end the pieces make the same `ModelStep` a plain call gives: the text, the tool calls (merged
from their deltas by index), the token ids and logprobs the endpoint sent per chunk, the
prompt's token ids (first chunk) and the version in `system_fingerprint`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.events import ModelStep, ToolCallRequest

OnDelta = Callable[[str], None]
"""Called with each new piece of the answer's text, in order."""


@dataclass
class StreamedCompletion:
    """The chunks of one streamed choice, accumulated."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    fingerprint: str | None = None
    model: str | None = None
    hidden_params: Any = None
    """litellm's `_hidden_params` of the stream (the Router's deployment that answered)."""

    def add(self, chunk: Any) -> str:
        """Take one `ModelResponseStream` chunk; returns its new text ("" when none)."""
        self.fingerprint = getattr(chunk, "system_fingerprint", None) or self.fingerprint
        self.model = getattr(chunk, "model", None) or self.model
        prompt_ids = getattr(chunk, "prompt_token_ids", None)
        if prompt_ids:
            self.prompt_token_ids = [int(t) for t in prompt_ids]
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        self.finish_reason = choice.finish_reason or self.finish_reason
        self.token_ids += [int(t) for t in getattr(choice, "token_ids", None) or []]
        self.logprobs += _logprob_values(getattr(choice, "logprobs", None))
        delta = choice.delta
        for call in getattr(delta, "tool_calls", None) or []:
            self._merge_call(call)
        text = getattr(delta, "content", None) or ""
        if text:
            self.text.append(text)
        return text

    def _merge_call(self, call: Any) -> None:
        slot = self.calls.setdefault(call.index or 0, {"id": "", "name": "", "arguments": ""})
        slot["id"] = call.id or slot["id"]
        function = call.function
        if function is not None:
            slot["name"] += function.name or ""
            slot["arguments"] += function.arguments or ""

    def step(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        model: str,
        index: int,
        latency_ms: float,
    ) -> ModelStep:
        """The model step this stream amounts to (as `policy_client.to_model_step` records)."""
        calls = [
            ToolCallRequest(
                id=c["id"] or f"call_{index}_{i}", name=c["name"], arguments=c["arguments"]
            )
            for i, c in sorted(self.calls.items())
        ]
        return ModelStep(
            index=index,
            messages=messages,
            tool_names=[t["function"]["name"] for t in tools],
            output="".join(self.text) if self.text or not calls else None,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            model=model,
            policy_version=self.fingerprint or self.model or model,
            prompt_token_ids=self.prompt_token_ids,
            completion_token_ids=self.token_ids or None,
            logprobs=self.logprobs or None,
            latency_ms=latency_ms,
        )


def _logprob_values(logprobs: Any) -> list[float]:
    if logprobs is None:
        return []
    content = logprobs.get("content") if isinstance(logprobs, dict) else logprobs.content
    return [float(t["logprob"] if isinstance(t, dict) else t.logprob) for t in content or []]
