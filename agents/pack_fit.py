"""Whether each agent's first call fits the model that serves it, asked before the first run.

The agent API sends arloop's policy server (`POST /tokenize`: the chat call's own checks,
nothing generated) each agent's first call as a run sends it: its system prompt, worked
examples and tools, a one-word message, and its sampling. A call the server would refuse (the
prompt over the context, `max_tokens` over what the context leaves or over the server's cap,
tools the chat template cannot write, a key it refuses) is one line naming the agent and the
fix. Agents served by another endpoint (OpenAI, vLLM, a team's own) are not asked.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from langchain_core.messages import HumanMessage

from agents.policy_client import Generation, PolicyConfig
from agents.run_context import to_openai
from agents.runtime import AgentSpec
from tools.registry import ToolRegistry

log = logging.getLogger(__name__)
PROBE = "Hello"
"""The user's message of the probe: the shortest a user sends."""
TIMEOUT_S = 10.0
LONG = "context_length_exceeded"


@dataclass(frozen=True)
class Fit:
    """What the policy server said of the agents' first calls: `problems`, one line each with
    its fix; `unchecked`, why nothing could be asked (the server not answering yet), or ''."""

    problems: list[str]
    unchecked: str = ""


def first_call(spec: AgentSpec, config: PolicyConfig) -> dict[str, Any]:
    """The chat request of `spec`'s first model call, as the policy client sends it."""
    kwargs, extra = (spec.generation or Generation()).request(config)
    messages = to_openai([HumanMessage(PROBE)], spec.system_prompt, list(spec.examples))
    tools = ToolRegistry(spec.tools).specs()
    body = {"model": config.model.split("/", 1)[-1], "messages": messages, **kwargs, **extra}
    return body | ({"tools": tools} if tools else {})


def check_fit(specs: list[AgentSpec], config: PolicyConfig) -> Fit:
    """Ask the policy server about every agent it serves (blocking; the agent API's start)."""
    asked = [(s, config.routed(s.model) if s.model else config) for s in specs]
    asked = [(s, c) for s, c in asked if c.kind == "arloop" and c.api_base]
    problems: list[str] = []
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for spec, cfg in asked:
            url = f"{_root(cfg.api_base or '')}/tokenize"
            headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
            try:
                response = client.post(url, json=first_call(spec, cfg), headers=headers)
            except httpx.HTTPError as exc:
                return Fit(problems, _unchecked(url, type(exc).__name__))
            if response.status_code in (404, 405) and _route_missing(response):
                log.info("%s has no /tokenize (not arloop's policy server): not checked", url)
                return Fit(problems)  # nothing to ask, now or later
            if response.status_code >= 500:
                return Fit(problems, _unchecked(url, f"it answered {response.status_code}"))
            if response.status_code != 200:
                problems.append(_problem(spec, cfg, response))
    return Fit(problems)


async def watch_fit(specs: list[AgentSpec], config: PolicyConfig, every_s: float = 5.0) -> None:
    """`check_fit` again until the policy server answers, then its problems as error lines:
    for a process that started before its policy server did."""
    while True:
        fit = await asyncio.to_thread(check_fit, specs, config)
        if not fit.unchecked:
            for line in fit.problems:
                log.error("%s", line)
            return
        await asyncio.sleep(every_s)


def _problem(spec: AgentSpec, config: PolicyConfig, response: httpx.Response) -> str:
    error = _error(response)
    message, param = str(error.get("message", response.text[:300])), error.get("param")
    head = f"agent {spec.name!r}: the policy server at {config.api_base} refuses its first call"
    if response.status_code in (401, 403):
        fix = "set ARLOOP_POLICY_API_KEY to one of the policy server's ARLOOP_POLICY_KEYS"
    elif param in ("max_tokens", "max_completion_tokens") and error.get("code") == LONG:
        fix = (
            "lower the agent's Generation.max_tokens (or ARLOOP_POLICY_MAX_TOKENS), shorten its "
            "system prompt and examples, or serve a model with a longer context "
            "(ARLOOP_CONTEXT_LENGTH on the policy server, up to the model's own)"
        )
    elif param in ("max_tokens", "max_completion_tokens"):
        fix = (
            "lower the agent's Generation.max_tokens (or ARLOOP_POLICY_MAX_TOKENS for every agent)"
        )
    elif error.get("code") == LONG:
        fix = (
            "shorten the agent's system prompt and worked examples, or serve a model with a "
            "longer context (ARLOOP_CONTEXT_LENGTH on the policy server, up to the model's own)"
        )
        if spec.tools:  # the hermes format writes each tool's JSON schema into the prompt
            fix = (
                "its tools' descriptions count: ARLOOP_TOOL_FORMAT=line on the policy server "
                "and the learner writes one line a tool; else " + fix
            )
    elif str(param).startswith(("tools", "messages")):
        fix = (
            "the model's chat template cannot write this call: set ARLOOP_TOOL_FORMAT=line on "
            "the policy server (tools described in the prompt, calls on one line)"
        )
    else:
        fix = "fix what the message names"
    return f"{head}: {message}: {fix}"


def _error(response: httpx.Response) -> dict[str, Any]:
    try:
        error = response.json().get("error", {})
    except (ValueError, AttributeError):
        return {}
    return error if isinstance(error, dict) else {}


def _route_missing(response: httpx.Response) -> bool:
    """A 404 for the route itself (Starlette's `Not Found`), not for the model it names."""
    return not _error(response)


def _root(api_base: str) -> str:
    base = api_base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _unchecked(url: str, why: str) -> str:
    return (
        f"the agents' first calls were not checked against the policy server ({url}: {why}); "
        "they are checked when it answers"
    )
