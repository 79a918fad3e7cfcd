"""What the nodes of one run share: policy, tools, memory, the step log; and message plumbing."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage

from agents.decisions import Decision, bounded_metadata, decided_metadata
from agents.events import ModelStep, StepEvent, ToolStep
from agents.memory import LongTermMemory
from agents.policy_client import Generation, PolicyClient
from agents.tracing import model_span, traced_tool
from tools.base import ToolResult
from tools.registry import ToolRegistry


@dataclass(frozen=True)
class RunUpdate:
    """What a run tells a live listener: its thread is held (`start`), a piece of a model's
    text as it streams (`delta`), a finished model call (`model`), a finished tool call (`tool`)."""

    kind: Literal["start", "delta", "model", "tool"]
    node: str  # the graph node that made the call (model, tools, evaluate, reflect)
    index: int  # the step's index in the trajectory
    text: str = ""
    step: StepEvent | None = None


Emit = Callable[[RunUpdate], None]


@dataclass
class RunContext:
    """Run-scoped context handed to every graph node (LangGraph `context_schema`)."""

    policy: PolicyClient
    tools: ToolRegistry
    system_prompt: str
    user_id: str
    task_kind: str | None = None
    arm: str | None = None
    memory: LongTermMemory | None = None
    verifier: ToolRegistry | None = None
    max_steps: int = 6
    examples: list[dict[str, Any]] = field(default_factory=list)
    """A worked example shown after the system prompt (OpenAI-format messages)."""
    guard: Callable[[str, str, str], Any] | None = None
    """The agent's `agents.guard.Guard`: decides what the run returns (None: the default)."""
    generation: Generation | None = None
    """The agent's own sampling settings, sent with each of its model calls."""
    retry_when: Callable[[str], bool] | None = None
    """Reflexion: whether a failed attempt at the question is worth a retry (None: always)."""
    decision: Decision | None = None
    """What the version's head decides in the model's final reply (`agents.decisions`)."""
    case: str = ""
    """The user's message this run answers, as the graph's first node read it (a reply to a
    follow-up question joined to its case): what a decision head reads. Not the thread's last
    human message, which on a Reflexion retry is the retry's instructions."""
    decided: dict[str, str] = field(default_factory=dict)
    """The head's last decision in this run (into the trajectory's metadata)."""
    steps: list[StepEvent] = field(default_factory=list)
    emit: Emit | None = None
    """A live listener (the agent API's stream): text as it comes, each step as it ends."""

    async def call_model(
        self, messages: list[dict[str, Any]], *, with_tools: bool = True, node: str = "model"
    ) -> ModelStep:
        """One policy call, appended to the step log (streamed to `emit` when there is one)."""
        specs = self.tools.specs() if with_tools else []
        index, emit = len(self.steps), self.emit
        on_delta = None
        if emit is not None:
            on_delta = lambda text: emit(RunUpdate("delta", node, index, text))  # noqa: E731
        with model_span(self.policy.model_for(self.arm), index):
            step = await self.policy.complete(
                messages,
                specs,
                arm=self.arm,
                index=index,
                on_delta=on_delta,
                sampling=self.generation,
            )
        self.steps.append(step)
        if emit is not None:
            emit(RunUpdate("model", node, index, step=step))
        return step

    async def decide(self, question: str, reply: str) -> str | None:
        """The final reply with the version's head's label in it (`agents.decisions`), or None
        when there is no decision to make, no head answers, or the reply takes no label."""
        if self.decision is None or self.decision.apply(reply, self.decision.labels[0]) is None:
            return None  # no decision, or a reply that takes no label (a follow-up question)
        decided = await self.policy.head(self.decision.name, question, arm=self.arm)
        if decided is None or decided.label not in self.decision.labels:
            return None
        self.decided = decided_metadata(self.decision, decided, reply)
        label = self.decision.bound(question, decided.label)
        if label != decided.label and label in self.decision.labels:
            self.decided |= bounded_metadata(self.decision, label)
        else:
            label = decided.label
        return self.decision.apply(reply, label)

    async def call_tool(
        self,
        registry: ToolRegistry,
        name: str,
        arguments: str | dict,
        call_id: str,
        node: str = "tools",
    ) -> ToolResult:
        """One sandboxed tool call, appended to the step log."""
        result = await traced_tool(registry, name, arguments, call_id)
        self.record_tool(result, node)
        return result

    def record_tool(self, result: ToolResult, node: str = "tools") -> None:
        step = tool_step(result, len(self.steps))
        self.steps.append(step)
        if self.emit is not None:
            self.emit(RunUpdate("tool", node, step.index, step=step))


def tool_step(result: ToolResult, index: int) -> ToolStep:
    return ToolStep(
        index=index,
        call_id=result.call_id,
        name=result.name,
        arguments=result.arguments,
        output=result.output,
        error=result.error,
        truncated=result.truncated,
        latency_ms=result.latency_ms,
    )


def ai_message(step: ModelStep) -> AIMessage:
    """The thread's assistant message for a model step; raw tool calls kept as written."""
    if not step.tool_calls:
        return AIMessage(content=step.output or "")
    raw = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in step.tool_calls
    ]
    return AIMessage(content=step.output or "", additional_kwargs={"tool_calls": raw})


def pending_tool_calls(message: AnyMessage) -> list[dict[str, Any]]:
    """The OpenAI-format tool calls an assistant message asks for (empty when none)."""
    if not isinstance(message, AIMessage):
        return []
    return message.additional_kwargs.get("tool_calls") or []


def to_openai(
    messages: list[AnyMessage],
    system_prompt: str | None = None,
    examples: list[dict[str, Any]] | None = None,
) -> list[dict]:
    """Chat messages in OpenAI wire format: the system prompt, the worked example, the thread."""
    wire: list[dict[str, Any]] = []
    if system_prompt:
        wire.append({"role": "system", "content": system_prompt})
    wire += [dict(m) for m in examples or []]
    for m in messages:
        wire.append(_wire(m))
    return wire


def _wire(m: AnyMessage) -> dict[str, Any]:
    if isinstance(m, SystemMessage):
        return {"role": "system", "content": _text(m)}
    if isinstance(m, HumanMessage):
        return {"role": "user", "content": _text(m)}
    if isinstance(m, ToolMessage):
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": _text(m)}
    if isinstance(m, AIMessage):
        calls = pending_tool_calls(m)
        if calls:  # no content key without text: litellm drops a null one on the wire
            text = {"content": _text(m)} if _text(m) else {}
            return {"role": "assistant", **text, "tool_calls": calls}
        return {"role": "assistant", "content": _text(m)}
    raise TypeError(f"cannot send a {type(m).__name__} to the policy")


def _text(m: AnyMessage) -> str:
    return m.content if isinstance(m.content, str) else json.dumps(m.content)
