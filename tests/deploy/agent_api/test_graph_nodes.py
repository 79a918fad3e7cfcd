"""Opt-in node recording (`agents.graph_nodes.record_nodes`): a plain LangGraph graph over
`ChatOpenAI`, one line added, and each call's step in the trajectory names the node that made
it; a node name that is not a plain name is a 400."""

from __future__ import annotations

from typing import Annotated, TypedDict

import httpx
import pytest
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from agents.events import STREAM_TRAJECTORIES, decode
from agents.graph_nodes import NODE_HEADER
from tests.deploy.agent_api import recorded_graph_model
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def graph(llm):
    """plan -> write: two nodes, one model call each."""

    def plan(state: State) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    def write(state: State) -> dict:
        return {"messages": [llm.invoke([*state["messages"], HumanMessage("Now answer.")])]}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("write", write)
    g.add_edge(START, "plan")
    g.add_edge("plan", "write")
    g.add_edge("write", END)
    return g.compile()


def _model(api, run: str, opted_in: bool):
    """The docs' model (`recorded_graph_model.py`), or the same ChatOpenAI without the line."""
    headers = {"X-Arloop-Run": run, "X-Arloop-Agent": "graph-bot"}
    base_url = f"{api.server.url}/v1"
    if opted_in:
        return recorded_graph_model.model(base_url, API_KEY, headers)
    return ChatOpenAI(
        base_url=base_url,
        api_key=API_KEY,
        model="arloop",
        default_headers=headers,
        include_response_headers=True,
    )


@pytest.mark.parametrize("opted_in, nodes", [(True, ["plan", "write"]), (False, [None, None])])
def test_each_step_names_the_node_that_made_it_when_the_graph_opts_in(
    start_api, llm, redis_client, opted_in, nodes
):
    llm.push(Reply(content="First, add."), Reply(content="#### 5"))
    api = start_api()
    out = graph(_model(api, "graph-1", opted_in)).invoke(
        {"messages": [HumanMessage("What is 2+3?")]}
    )
    assert out["messages"][-1].content == "#### 5"
    trajectory_id = out["messages"][-1].response_metadata["headers"]["x-arloop-trajectory"]
    ended = api.http.post(f"/v1/runs/{trajectory_id}/end", json={"output": "#### 5"})
    assert ended.status_code == 200, ended.text
    [event] = [decode(f) for _, f in redis_client.xrange(STREAM_TRAJECTORIES)]
    assert [s.node for s in event.model_steps] == nodes
    # the report card counts each node's calls (none when the graph did not say)
    [card] = api.http.get("/v1/report-card").json()["agents"]
    assert card["agent"] == "graph-bot" and card["runs"] == 1
    said = {n: (c["calls"], c["tool_calls"]) for n, c in card["nodes"].items()}
    assert said == ({"plan": (1, 0), "write": (1, 0)} if opted_in else {})
    assert all(c["latency_ms"] > 0 for c in card["nodes"].values())


def test_a_node_header_that_is_not_a_plain_name_is_a_400(start_api, llm):
    api = start_api()
    answer = httpx.post(
        f"{api.server.url}/v1/chat/completions",
        json={"model": "arloop", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {API_KEY}", NODE_HEADER: "no spaces please"},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == NODE_HEADER
