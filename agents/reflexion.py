"""The Reflexion agent: recall → attempt (ReAct) → evaluate → reflect and retry, bounded → review.

Evaluation uses the agent's verifier tool when it has one (called with `question` and
`answer`; an output starting with "PASS" passes, anything else is the critique), else the
model checks its own answer. A failed attempt becomes a written reflection, stored in
long-term memory under the user and task kind, and later runs recall the relevant ones.
The last node, `review`, applies the agent's guard (`agents.guard`): an answer that still fails
after the last attempt is replaced by the pack's safe fallback, never returned.
"""

from __future__ import annotations

from typing import Literal

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from agents.events import RunStatus
from agents.guard import follow_up_case, review
from agents.react import AgentState, call_model, format_notes, run_input, run_tools
from agents.run_context import RunContext, pending_tool_calls
from agents.tracing import traced_node

CHECK_PROMPT = (
    "You check answers. Reply PASS if the answer fully and correctly answers the question; "
    "otherwise reply FAIL: followed by what is wrong."
)
REFLECT_PROMPT = (
    "An answer you gave failed its check. In two or three sentences, say what went wrong and "
    "what you will do differently on this kind of task. Write it as advice to yourself."
)


class ReflexionState(AgentState):
    question: str  # the user's request this run answers
    attempts_left: int  # retries still allowed after the current attempt
    verdict: str  # pass | fail | error | "" (not judged yet)
    critique: str


def reflexion_input(text: str, max_steps: int, max_attempts: int) -> dict:
    """The state update that starts a Reflexion run."""
    return run_input(text, max_steps) | {
        "question": text,
        "attempts_left": max_attempts - 1,
        "verdict": "",
        "critique": "",
    }


@traced_node("recall")
async def recall(state: ReflexionState, runtime: Runtime[RunContext]) -> dict:
    """The run's case (a reply to a follow-up question joins the case it answers), lessons
    from earlier failures on similar tasks, and facts about the user."""
    ctx = runtime.context
    q = follow_up_case(state, state["question"])
    ctx.case = q  # call_model's state is ReAct's, without `question`: the head reads this
    case = {"question": q, "pending": ""}  # a reply to a follow-up joins its case
    if ctx.memory is None:
        return case | {"notes": ""}
    lessons = await ctx.memory.recall(ctx.user_id, ctx.task_kind, "reflection", q)
    facts = await ctx.memory.recall(ctx.user_id, ctx.task_kind, "fact", q)
    notes = [
        format_notes(
            "Lessons from your earlier attempts at similar tasks:", [m.text for m in lessons]
        ),
        format_notes("What you know about this user:", [m.text for m in facts]),
    ]
    return case | {"notes": "\n\n".join(n for n in notes if n)}


def last_answer(state: ReflexionState) -> str:
    last = state["messages"][-1]
    return last.content if isinstance(last, AIMessage) and isinstance(last.content, str) else ""


@traced_node("evaluate")
async def evaluate(state: ReflexionState, runtime: Runtime[RunContext]) -> dict:
    """Judge the attempt with the verifier tool, else with the model's own check."""
    ctx = runtime.context
    question, answer = state["question"], last_answer(state)
    if ctx.verifier is not None:
        name = ctx.verifier.names[0]
        args = {"question": question, "answer": answer}
        result = await ctx.call_tool(
            ctx.verifier, name, args, f"verify_{len(ctx.steps)}", node="evaluate"
        )
        if result.error:  # a broken verifier cannot judge: stop rather than retry blindly
            return {"verdict": "error", "critique": result.output}
        verdict_text = result.output
    else:
        check = [
            {"role": "system", "content": CHECK_PROMPT},
            {"role": "user", "content": f"Question: {question}\n\nAnswer: {answer}"},
        ]
        verdict_text = (await ctx.call_model(check, with_tools=False, node="evaluate")).output or ""
    passed = verdict_text.strip().upper().startswith("PASS")
    return {"verdict": "pass" if passed else "fail", "critique": verdict_text.strip()}


@traced_node("reflect")
async def reflect(state: ReflexionState, runtime: Runtime[RunContext]) -> dict:
    """Write down what went wrong, remember it, and start the next attempt."""
    ctx = runtime.context
    prompt = [
        {"role": "system", "content": REFLECT_PROMPT},
        {
            "role": "user",
            "content": f"Question: {state['question']}\n\nYour answer: "
            f"{last_answer(state)}\n\nCheck: {state['critique']}",
        },
    ]
    step = await ctx.call_model(prompt, with_tools=False, node="reflect")
    reflection = (step.output or "").strip()
    if ctx.memory is not None and reflection:
        await ctx.memory.add(
            ctx.user_id, ctx.task_kind, "reflection", reflection, source=state["question"]
        )
    retry = HumanMessage(
        f"Your answer did not pass the check: {state['critique']}\n"
        f"Your reflection: {reflection}\nTry again."
    )
    return {
        "messages": [retry],
        "attempts_left": state["attempts_left"] - 1,
        "steps_left": ctx.max_steps,
        "status": RunStatus.OK.value,
        "verdict": "",
    }


def after_model(state: ReflexionState) -> Literal["tools", "evaluate"]:
    return "tools" if pending_tool_calls(state["messages"][-1]) else "evaluate"


def after_evaluate(
    state: ReflexionState, runtime: Runtime[RunContext]
) -> Literal["reflect", "review"]:
    worth = runtime.context.retry_when
    if state["verdict"] != "fail" or state["attempts_left"] <= 0:
        return "review"
    return "reflect" if worth is None or worth(state["question"]) else "review"


def build_reflexion(checkpointer=None):
    """The compiled Reflexion graph (with a checkpointer for threads, or bare)."""
    graph = StateGraph(ReflexionState, context_schema=RunContext)
    graph.add_node("recall", recall)
    graph.add_node("model", call_model)
    graph.add_node("tools", run_tools)
    graph.add_node("evaluate", evaluate)
    graph.add_node("reflect", reflect)
    graph.add_node("review", review)  # a failed last attempt is never returned
    graph.add_edge(START, "recall")
    graph.add_edge("recall", "model")
    graph.add_conditional_edges("model", after_model, ["tools", "evaluate"])
    graph.add_edge("tools", "model")
    graph.add_conditional_edges("evaluate", after_evaluate, ["reflect", "review"])
    graph.add_edge("reflect", "model")
    graph.add_edge("review", END)
    return graph.compile(checkpointer=checkpointer, name="reflexion")
