"""The last node of a run: who answers, the model, a pack's envelope, or its safe fallback.

A guard (`AgentSpec.guard`) sees the question (as the graph got it: PHI-scrubbed), the
model's final answer and the verifier's verdict, and returns what the user gets and which
path wrote it (`AnswerPath`). It is plain code, independent of the model: a pack's
guarantees ("red flags always escalated", "never a failed answer") live here, not in the
prompt. Without a pack guard a Reflexion agent still never returns an answer its verifier
failed: `default_review` replaces it with `UNCHECKED`.

The replacement takes the model's message's place in the thread (the user's next turn sees
what they were told); the model's own answer stays in the trajectory (`model_output`, and its
model step), so the learner and the gate can judge the model apart from the envelope.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.runtime import Runtime

from agents.events import AnswerPath
from agents.run_context import RunContext

UNCHECKED = (
    "I could not give an answer that passed its checks, so I will not guess. Please rephrase "
    "your question, or ask a person."
)


@dataclass(frozen=True)
class Reviewed:
    """What a run returns, who wrote it, and what the guard found (into the metadata)."""

    output: str
    answered_by: AnswerPath
    metadata: dict[str, str] = field(default_factory=dict)
    follow_up: str | None = None
    """The label of what `output` asks the user (None: it answers); see the module's text."""


Guard = Callable[[str, str, str], Reviewed]
"""(question, the model's final answer, verdict: pass | fail | error | "") -> what is returned."""


def default_review(question: str, answer: str, verdict: str) -> Reviewed:
    """No pack guard: the model answers, unless its verifier failed it (or could not judge)."""
    if verdict in ("fail", "error"):
        return Reviewed(UNCHECKED, AnswerPath.FALLBACK)
    return Reviewed(answer, AnswerPath.MODEL)


async def review(state: dict[str, Any], runtime: Runtime[RunContext]) -> dict:
    """Apply the agent's guard to the run's final answer (the graphs' last node)."""
    ctx = runtime.context
    last = state["messages"][-1]
    answer = last.content if isinstance(last, AIMessage) and isinstance(last.content, str) else ""
    guard = ctx.guard or default_review
    reviewed = guard(question_of(state), answer, state.get("verdict") or "")
    update: dict[str, Any] = {
        "answered_by": reviewed.answered_by.value,
        "review": dict(reviewed.metadata),
        "pending": f"{question_of(state)}\n{reviewed.follow_up}: " if reviewed.follow_up else "",
    }
    if reviewed.answered_by is not AnswerPath.MODEL:
        # same id: the reducer replaces the model's message in the thread
        update["messages"] = [AIMessage(reviewed.output, id=last.id)]
        update["model_answer"] = answer
    return update


def follow_up_case(state: dict[str, Any], text: str) -> str:
    """The case a run answers: `text`, after the case a follow-up question left pending."""
    pending = state.get("pending") or ""
    return f"{pending}{text}" if pending else text


def question_of(state: dict[str, Any]) -> str:
    """The user's message this run answers (Reflexion keeps it; ReAct: the last human turn)."""
    if state.get("question"):
        return state["question"]
    for m in reversed(state["messages"]):
        if isinstance(m, HumanMessage):
            return m.content if isinstance(m.content, str) else str(m.content)
    return ""
