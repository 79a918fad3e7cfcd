"""The tutor as a team writes it in plain LangGraph: a `StateGraph` of four nodes (`read` the
problem, `think` with the model, `calculate` its tool calls, `answer`) over
`langchain_openai.ChatOpenAI`. Nothing of arloop here: the model's base URL, name and headers
say where it runs."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from tests.examples.calculator import calculate
from tests.examples.prompt import EXAMPLE, SYSTEM

MAX_CALLS = 3


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '42-12' or '(3+4)*5'."""
    return calculate(expression)


class State(TypedDict):
    question: str
    messages: Annotated[list[AnyMessage], add_messages]
    calls: int
    answer: str


def build(model: ChatOpenAI):
    """The compiled graph: read -> think -> (calculate -> think)* -> answer."""
    llm = model.bind_tools([calculator])

    def read(state: State) -> dict:
        shown = [SystemMessage(SYSTEM), *convert_to_messages(EXAMPLE)]
        return {"messages": [*shown, ("user", state["question"])], "calls": 0}

    def think(state: State) -> dict:
        return {"messages": [llm.invoke(state["messages"])], "calls": state["calls"] + 1}

    def calculate_node(state: State) -> dict:
        last = state["messages"][-1]
        return {
            "messages": [
                ToolMessage(calculator.invoke(c["args"]), tool_call_id=c["id"])
                if c["name"] == "calculator"
                else ToolMessage(f"error: no tool {c['name']}", tool_call_id=c["id"])
                for c in last.tool_calls
            ]
        }

    def answer(state: State) -> dict:
        last = state["messages"][-1]
        return {"answer": last.content if isinstance(last, AIMessage) else ""}

    def route(state: State) -> str:
        last = state["messages"][-1]
        wants_tool = isinstance(last, AIMessage) and bool(last.tool_calls)
        return "calculate" if wants_tool and state["calls"] < MAX_CALLS else "answer"

    graph = StateGraph(State)
    graph.add_node("read", read)
    graph.add_node("think", think)
    graph.add_node("calculate", calculate_node)
    graph.add_node("answer", answer)
    graph.add_edge(START, "read")
    graph.add_edge("read", "think")
    graph.add_conditional_edges("think", route, ["calculate", "answer"])
    graph.add_edge("calculate", "think")
    graph.add_edge("answer", END)
    return graph.compile()


def solve(model: ChatOpenAI, question: str) -> tuple[str, dict[str, str]]:
    """(the answer, the last model response's headers; `include_response_headers=True`)."""
    state = build(model).invoke({"question": question, "messages": [], "calls": 0, "answer": ""})
    replies = [m for m in state["messages"][len(EXAMPLE) + 1 :] if isinstance(m, AIMessage)]
    headers = replies[-1].response_metadata.get("headers", {}) if replies else {}
    return str(state["answer"] or ""), dict(headers)


def chat_model(base_url: str, api_key: str, model: str, headers: dict[str, str]) -> ChatOpenAI:
    """The team's model client: any OpenAI-compatible endpoint."""
    return ChatOpenAI(
        base_url=base_url,
        api_key=api_key,
        model=model,
        default_headers=headers,
        max_retries=0,
        include_response_headers=True,
    )
