"""A team's LangGraph model, each call naming the graph node that made it: one line more."""

from langchain_openai import ChatOpenAI

from agents.graph_nodes import record_nodes


def model(base_url: str, api_key: str, headers: dict[str, str]):
    """ChatOpenAI on the agent API; `record_nodes` sends each call's node as X-Arloop-Node."""
    llm = ChatOpenAI(
        base_url=base_url,
        api_key=api_key,
        model="arloop",
        default_headers=headers,  # X-Arloop-Run, X-Arloop-Agent
        include_response_headers=True,  # X-Arloop-Trajectory, X-Arloop-Feedback-Token
    )
    return record_nodes(llm)  # the opt-in line (bind tools first, if the graph has any)
