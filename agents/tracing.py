"""OpenTelemetry spans around graph nodes and tool calls.

Only the OpenTelemetry API is used here: until a process installs an SDK tracer provider
(`deploy.telemetry.setup_tracing`, when `ARLOOP_OTLP_ENDPOINT` is set) every span is the
API's no-op span, so an unconfigured deployment exports nothing and pays next to nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry import trace

from tools.base import ToolResult
from tools.registry import ToolRegistry

_tracer = trace.get_tracer("arloop.agents")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def traced_node(name: str) -> Callable[[F], F]:
    """Run a graph node inside a span `node.<name>` (the signature stays: LangGraph reads it)."""

    def wrap(node: F) -> F:
        @functools.wraps(node)
        async def run(*args: Any, **kwargs: Any) -> Any:
            with _tracer.start_as_current_span(f"node.{name}", attributes={"arloop.node": name}):
                return await node(*args, **kwargs)

        return run  # type: ignore[return-value]

    return wrap


async def traced_tool(
    registry: ToolRegistry, name: str, arguments: str | dict, call_id: str
) -> ToolResult:
    """One sandboxed tool call inside a span `tool.<name>`, its error recorded on the span."""
    with _tracer.start_as_current_span(
        f"tool.{name}", attributes={"arloop.tool": name, "arloop.call_id": call_id}
    ) as span:
        result = await registry.call(name, arguments, call_id)
        if result.error:
            span.set_attribute("arloop.tool.error", result.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, result.error))
        return result


def model_span(model: str, index: int):
    """The span of one policy call (a context manager)."""
    return _tracer.start_as_current_span(
        "policy.complete", attributes={"arloop.model": model, "arloop.step": index}
    )
