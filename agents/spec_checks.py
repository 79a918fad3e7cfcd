"""`AgentSpec`'s field checks: a wrong type or value is an `AgentSpecError` naming the agent, the
field, what it got and what it takes, when the spec is made (a pack's import), never a graph
served as something else or a 500 from `GET /v1/agents` later."""

from __future__ import annotations

from typing import Any

from agents.model_routes import ModelRoute
from agents.policy_client import Generation
from tools.base import Tool

KINDS = ("react", "reflexion")
"""The loops an AgentSpec can run (`AgentSpec.kind`)."""


class AgentSpecError(ValueError):
    """An AgentSpec field of the wrong type or value; the message names the field and the fix."""

    def __init__(self, agent: object, field: str, problem: str) -> None:
        name = agent if isinstance(agent, str) and agent else "?"
        super().__init__(f"AgentSpec {name!r}: {field} {problem}")
        self.field = field


def check_spec(spec: Any) -> dict[str, Any]:
    """Raise AgentSpecError for the first wrong field of `spec`; the fields to set anew (a list
    of tools or examples taken as the tuple the spec keeps)."""
    name = spec.name
    if not isinstance(name, str) or not name.strip():
        raise AgentSpecError(name, "name", f"is {_shown(name)}: give it a non-empty str")
    for field in ("description", "system_prompt"):
        _expect(spec, field, str, "a str")
    _check_kind(spec)
    for field in ("task_kind", "disclaimer"):
        _expect(spec, field, (str, type(None)), "a str or None")
    for field in ("max_steps", "max_attempts"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AgentSpecError(name, field, f"is {_shown(value)}: give it an int >= 1")
    for field in ("input_filter", "escalate", "retry_when", "guard"):
        value = getattr(spec, field)
        if value is not None and not callable(value):
            raise AgentSpecError(name, field, f"is {_shown(value)}: give it a function or None")
    _expect(spec, "verifier", (Tool, type(None)), "a tools.base.Tool or None")
    _expect(spec, "generation", (Generation, type(None)), "an agents.policy_client.Generation")
    _expect(spec, "model", (ModelRoute, type(None)), "an agents.model_routes.ModelRoute")
    return {
        "tools": _items(spec, "tools", Tool, "tools.base.Tool"),
        "examples": _items(spec, "examples", dict, "dict (an OpenAI-format message)"),
    }


def _check_kind(spec: Any) -> None:
    kind = spec.kind
    allowed = ", ".join(map(repr, KINDS))
    if not isinstance(kind, str):
        hint = ""
        if callable(getattr(kind, "invoke", None)):  # a compiled LangGraph graph, a Runnable
            hint = (
                "; a graph of your own is served as a team's agent through "
                "/v1/chat/completions (docs/any_agent.md), not as an AgentSpec"
            )
        raise AgentSpecError(spec.name, "kind", f"is {_shown(kind)}, not one of {allowed}{hint}")
    if kind not in KINDS:
        raise AgentSpecError(spec.name, "kind", f"is {kind!r}: give one of {allowed}")


def _expect(spec: Any, field: str, types: type | tuple[type, ...], what: str) -> None:
    value = getattr(spec, field)
    if not isinstance(value, types):
        raise AgentSpecError(spec.name, field, f"is {_shown(value)}: give it {what}")


def _items(spec: Any, field: str, item: type, what: str) -> tuple[Any, ...]:
    value = getattr(spec, field)
    if not isinstance(value, (tuple, list)):
        raise AgentSpecError(spec.name, field, f"is {_shown(value)}: give it a tuple of {what}")
    bad = next((v for v in value if not isinstance(v, item)), None)
    if bad is not None:
        raise AgentSpecError(spec.name, field, f"holds {_shown(bad)}: give it a tuple of {what}")
    return tuple(value)


def _shown(value: object) -> str:
    """A value as the message shows it: short, with its type where its repr hides it."""
    if isinstance(value, (str, int, float, type(None))):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
