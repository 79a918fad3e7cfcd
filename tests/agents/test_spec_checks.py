"""AgentSpec refuses a wrong field when it is made, naming the field and what it takes, and
what `GET /v1/agents` shows of a spec is plain JSON whatever the spec holds."""

import json

import pytest
from langgraph.graph import END, START, MessagesState, StateGraph

from agents.packs import Pack, PackNotFound
from agents.packs.loading import load_target
from agents.runtime import AgentSpec
from agents.spec_checks import AgentSpecError


def _graph():
    graph = StateGraph(MessagesState)
    graph.add_node("answer", lambda state: state)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()


def _spec(**kw) -> AgentSpec:
    return AgentSpec(name="faq", description="d", system_prompt="s", **kw)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"kind": "plan-execute"}, "kind is 'plan-execute': give one of 'react', 'reflexion'"),
        ({"tools": ["kb_search"]}, "tools holds 'kb_search': give it a tuple of tools.base.Tool"),
        ({"max_steps": 0}, "max_steps is 0: give it an int >= 1"),
        ({"max_attempts": True}, "max_attempts is True: give it an int >= 1"),
        ({"system_prompt": None}, "system_prompt is None: give it a str"),
        ({"escalate": "911"}, "escalate is '911': give it a function or None"),
    ],
)
def test_a_wrong_field_is_refused_naming_it_and_what_it_takes(kw, says):
    base = {"system_prompt": "s"} | kw
    with pytest.raises(AgentSpecError) as caught:
        AgentSpec(name="faq", description="d", **base)
    assert str(caught.value) == f"AgentSpec 'faq': {says}"
    assert caught.value.field == next(iter(kw))


def test_a_compiled_langgraph_graph_as_kind_is_refused_with_where_such_a_graph_goes():
    with pytest.raises(AgentSpecError) as caught:
        _spec(kind=_graph())
    message = str(caught.value)
    assert message.startswith("AgentSpec 'faq': kind is a CompiledStateGraph, not one of ")
    assert "'react', 'reflexion'" in message and "docs/any_agent.md" in message
    assert "\n" not in message


def test_a_list_of_tools_is_kept_as_a_tuple():
    assert _spec(tools=[]).tools == ()


def test_a_pack_whose_spec_is_wrong_fails_to_load_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "graph_pack.py").write_text(
        "from agents.packs import Pack\nfrom agents.runtime import AgentSpec\n"
        "pack = Pack('mine', (AgentSpec(name='mine', description='d', system_prompt='s', "
        "kind='langgraph'),))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PackNotFound) as caught:
        load_target("graph_pack:pack", "graph_pack:pack")
    assert "AgentSpec 'mine': kind is 'langgraph': give one of 'react', 'reflexion'" in str(
        caught.value
    )


def test_what_the_agent_list_shows_is_json_even_for_a_spec_changed_after_its_checks():
    spec = _spec()
    object.__setattr__(spec, "kind", _graph())  # past the checks, as nothing should do
    shown = spec.public()
    assert json.loads(json.dumps(shown))["kind"].startswith("<langgraph")
    assert Pack("p", (spec,)).agents[0].public() == shown
