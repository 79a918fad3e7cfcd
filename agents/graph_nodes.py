"""Opt in: each model call of a LangGraph graph names the node that made it.

`record_nodes(model)` wraps a LangChain chat model (`ChatOpenAI`, tools bound or not) so that
every call sends `X-Arloop-Node: <node>`, the node's name from LangGraph's run metadata
(`langgraph_node`). The agent API keeps it on the call's step (`ModelStep.node`); the learner
reports its round per node (`learner.round_metrics.node_metrics`). The one line a graph adds:

    llm = record_nodes(ChatOpenAI(base_url=..., model="arloop").bind_tools(tools))

A call made outside a graph node sends no header; nothing else of the call changes.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda

NODE_HEADER = "X-Arloop-Node"


def record_nodes(model: Runnable) -> Runnable:
    """`model`, each call from a LangGraph node sending that node's name in `X-Arloop-Node`."""

    def named(config: RunnableConfig) -> Runnable:
        node = (config.get("metadata") or {}).get("langgraph_node")
        return model.bind(extra_headers={NODE_HEADER: str(node)}) if node else model

    def call(messages: Any, config: RunnableConfig) -> Any:
        return named(config).invoke(messages, config)

    async def acall(messages: Any, config: RunnableConfig) -> Any:
        return await named(config).ainvoke(messages, config)

    return RunnableLambda(call, afunc=acall, name="record_nodes")
