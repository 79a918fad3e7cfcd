"""The trajectory sink: each finished run is one `TrajectoryEvent` XADDed to the stream.

With a scrubber, every text (input, output, message contents, tool arguments and outputs)
is scrubbed first. Token ids would carry the raw text too, so a step whose prompt text
changed loses its `prompt_token_ids`, and one whose output changed loses its completion
token ids and logprobs: no raw PHI reaches Redis, not even as token ids.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from agents.events import (
    CASE_KEY,
    ONE_SHARD,
    ModelStep,
    StreamShards,
    ToolStep,
    TrajectoryEvent,
    encode,
)

Scrub = Callable[[str], str]


class TrajectorySink:
    """Writes finished runs to their shard of the trajectory stream, or to one `stream` given
    (scrubbed when asked)."""

    def __init__(
        self,
        client: aioredis.Redis,
        scrub: Scrub | None = None,
        stream: str | None = None,
        max_entries: int | None = None,
        shards: StreamShards = ONE_SHARD,
    ) -> None:
        self.client = client
        self.scrub = CleanTexts(scrub) if scrub is not None else None
        self.stream = stream  # eval runs go to STREAM_EVAL_TRAJECTORIES: the learner never reads it
        self.shards = shards  # without `stream`: the run's shard (`StreamShards.of`)
        # XADD MAXLEN ~: the oldest entries go past it (split between the shards)
        self.max_entries = (
            max_entries if max_entries is None or stream else -(-max_entries // shards.count)
        )

    def stream_of(self, trajectory_id: str) -> str:
        """The stream a run goes to."""
        return self.stream or self.shards.trajectories(self.shards.of(trajectory_id))

    async def write(self, event: TrajectoryEvent) -> str:
        """XADD the event; returns the stream entry id."""
        if self.scrub is not None:  # CPU-heavy (presidio): off the event loop
            event = await asyncio.to_thread(scrub_trajectory, event, self.scrub)
        entry_id = await self.client.xadd(
            self.stream_of(event.trajectory_id),
            encode(event),
            maxlen=self.max_entries,
            approximate=True,
        )
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


class CleanTexts:
    """A scrubber that remembers the last `size` texts it found nothing in, and skips them.

    Every run repeats the system prompt and the worked example; scrubbing them once per
    process is enough. Only texts that came back unchanged are kept, so the memory never
    holds an identifier.
    """

    def __init__(self, scrub: Scrub, size: int = 1024) -> None:
        self._scrub, self._size = scrub, size
        self._clean: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # sinks scrub in worker threads

    def __call__(self, text: str) -> str:
        with self._lock:
            if text in self._clean:
                self._clean.move_to_end(text)
                return text
        out = self._scrub(text)
        if out == text:
            with self._lock:
                self._clean[text] = None
                if len(self._clean) > self._size:
                    self._clean.popitem(last=False)
        return out


def scrub_trajectory(event: TrajectoryEvent, scrub: Scrub) -> TrajectoryEvent:
    """The event with every text scrubbed (each distinct text scrubbed once)."""
    memo: dict[str, str] = {}

    def s(text: str) -> str:
        if text not in memo:
            memo[text] = scrub(text)
        return memo[text]

    steps = [
        _model_step(st, s) if isinstance(st, ModelStep) else _tool_step(st, s) for st in event.steps
    ]
    model_output = s(event.model_output) if event.model_output is not None else None
    metadata = event.metadata
    if CASE_KEY in metadata:  # the user's earlier message, joined to their reply
        metadata = metadata | {CASE_KEY: s(metadata[CASE_KEY])}
    return event.model_copy(
        update={
            "input": s(event.input),
            "output": s(event.output),
            "model_output": model_output,
            "steps": steps,
            "metadata": metadata,
        }
    )


def scrub_model_step(step: ModelStep, scrub: Scrub, *, prompt: bool = True) -> ModelStep:
    """One model step scrubbed as `scrub_trajectory` scrubs it (for a step kept in Redis
    before its run is written: the agent API's calls from other agents); `prompt=False`: its
    messages were scrubbed before the model read them (`scrub_messages`), only its answer is."""
    return _model_step(step, scrub, prompt=prompt)


def scrub_messages(messages: list[dict[str, Any]], scrub: Scrub) -> list[dict[str, Any]]:
    """OpenAI chat messages with their text and tool-call arguments scrubbed (what a model is
    sent when PHI must not reach it)."""
    return [_message(m, scrub) for m in messages]


def _model_step(step: ModelStep, s: Scrub, *, prompt: bool = True) -> ModelStep:
    messages = [_message(m, s) for m in step.messages] if prompt else step.messages
    output = s(step.output) if step.output else step.output
    calls = [c.model_copy(update={"arguments": s(c.arguments)}) for c in step.tool_calls]
    update: dict[str, Any] = {"messages": messages, "output": output, "tool_calls": calls}
    if messages != step.messages:
        update["prompt_token_ids"] = None
    if output != step.output or calls != step.tool_calls:
        update |= {"completion_token_ids": None, "logprobs": None}
    return step.model_copy(update=update)


def _tool_step(step: ToolStep, s: Scrub) -> ToolStep:
    return step.model_copy(update={"arguments": _json(step.arguments, s), "output": s(step.output)})


def _message(message: dict[str, Any], s: Scrub) -> dict[str, Any]:
    out = dict(message)
    if isinstance(out.get("content"), str):
        out["content"] = s(out["content"])
    elif isinstance(out.get("content"), list):  # OpenAI's text parts
        out["content"] = [_json(part, s) for part in out["content"]]
    if out.get("tool_calls"):
        out["tool_calls"] = [_wire_call(c, s) for c in out["tool_calls"]]
    return out


def _wire_call(call: dict[str, Any], s: Scrub) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        function["arguments"] = s(function["arguments"])
    return {**call, "function": function}


def _json(value: Any, s: Scrub) -> Any:
    """Scrub every string inside a JSON-like value."""
    if isinstance(value, str):
        return s(value)
    if isinstance(value, dict):
        return {k: _json(v, s) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v, s) for v in value]
    return value
