"""The ReAct agent: recall → model ↔ tools, within a budget of model calls per run."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime

from agents.events import AnswerPath, RunStatus
from agents.guard import question_of, review
from agents.run_context import RunContext, ai_message, pending_tool_calls, to_openai
from agents.tracing import traced_node, traced_tool

BUDGET_NOTE = "I could not finish this within my step budget."


class AgentState(TypedDict):
    """A thread's state: the conversation, plus what the current run has left."""

    messages: Annotated[list[AnyMessage], add_messages]
    steps_left: int  # model calls this run (or this attempt) may still make
    status: str  # RunStatus of the current run
    notes: str  # what long-term memory recalled for this run (goes into the system prompt)
    answered_by: str  # AnswerPath of the current run's answer (the guard sets it)
    model_answer: str  # the model's own final answer when the guard replaced it
    review: dict[str, str]  # what the guard found (copied into the trajectory's metadata)
    pending: str  # a case awaiting the user's reply to a follow-up question (`agents.guard`)


def run_input(text: str, max_steps: int) -> dict:
    """The state update that starts a run on a new or existing thread."""
    return {
        "messages": [HumanMessage(text, id=str(uuid.uuid4()))],  # a failed run is rolled back by it
        "steps_left": max_steps,
        "status": RunStatus.OK.value,
        "notes": "",
        "answered_by": AnswerPath.MODEL.value,
        "model_answer": "",
        "review": {},
    }


def system_prompt(ctx: RunContext, state: AgentState) -> str:
    notes = state.get("notes") or ""
    return f"{ctx.system_prompt}\n\n{notes}" if notes else ctx.system_prompt


def last_user_text(messages: list[AnyMessage]) -> str:
    for m in reversed(messages):
        if isinstance(m, HumanMessage):
            return m.content if isinstance(m.content, str) else str(m.content)
    return ""


@traced_node("recall")
async def recall_facts(state: AgentState, runtime: Runtime[RunContext]) -> dict:
    """Put what we know about this user that bears on the question into the prompt."""
    ctx = runtime.context
    ctx.case = last_user_text(state["messages"])
    if ctx.memory is None:
        return {"notes": ""}
    query = ctx.case
    facts = await ctx.memory.recall(ctx.user_id, ctx.task_kind, "fact", query)
    return {"notes": format_notes("What you know about this user:", [f.text for f in facts])}


def format_notes(title: str, lines: list[str]) -> str:
    return f"{title}\n" + "\n".join(f"- {line}" for line in lines) if lines else ""


@traced_node("model")
async def call_model(state: AgentState, runtime: Runtime[RunContext]) -> dict:
    """Ask the policy for the next move; past the step budget a pending call is refused."""
    ctx = runtime.context
    wire = to_openai(state["messages"], system_prompt(ctx, state), ctx.examples)
    step = await ctx.call_model(wire)
    left = state["steps_left"] - 1
    if step.tool_calls and left <= 0:
        # The trajectory keeps the call the model made; the thread gets a closing answer.
        status = RunStatus.STEP_BUDGET.value
        return {"messages": [AIMessage(BUDGET_NOTE)], "steps_left": 0, "status": status}
    message = ai_message(step)
    if not step.tool_calls:  # the final reply: a decision the version's head makes goes in
        decided = await ctx.decide(ctx.case or question_of(state), step.output or "")
        if decided is not None:
            message = AIMessage(content=decided)
    return {"messages": [message], "steps_left": left}


@traced_node("tools")
async def run_tools(state: AgentState, runtime: Runtime[RunContext]) -> dict:
    """Run the requested tool calls (concurrently, sandboxed); each result is an observation."""
    ctx = runtime.context
    calls = pending_tool_calls(state["messages"][-1])
    results = await asyncio.gather(
        *(
            traced_tool(ctx.tools, c["function"]["name"], c["function"]["arguments"], c["id"])
            for c in calls
        )
    )
    for result in results:  # logged in the order the model asked, not the order they ended
        ctx.record_tool(result)
    return {"messages": [ToolMessage(r.output, tool_call_id=r.call_id) for r in results]}


def after_model(state: AgentState) -> Literal["tools", "__end__"]:
    return "tools" if pending_tool_calls(state["messages"][-1]) else END


def after_model_guarded(state: AgentState) -> Literal["tools", "review"]:
    return "tools" if pending_tool_calls(state["messages"][-1]) else "review"


def build_react(checkpointer=None, *, guarded: bool = False):
    """The compiled ReAct graph (with a checkpointer for threads, or bare); `guarded`: the
    final answer goes through the agent's guard (`agents.guard.review`) before it ends."""
    graph = StateGraph(AgentState, context_schema=RunContext)
    graph.add_node("recall", recall_facts)
    graph.add_node("model", call_model)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "recall")
    graph.add_edge("recall", "model")
    if guarded:
        graph.add_node("review", review)
        graph.add_conditional_edges("model", after_model_guarded, ["tools", "review"])
        graph.add_edge("review", END)
    else:
        graph.add_conditional_edges("model", after_model, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer, name="react")
