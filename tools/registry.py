"""A registry of tools and the sandbox around every call: validation, timeout, output cap."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from tools.base import Tool, ToolError, ToolResult

log = logging.getLogger(__name__)


class ToolRegistry:
    """Named tools; `call` never raises: every failure becomes an error observation."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [tool.spec() for tool in self._tools.values()]

    async def call(self, name: str, arguments: str | dict[str, Any], call_id: str) -> ToolResult:
        """Run one tool call in the sandbox and return the observation (never raises)."""
        start = time.perf_counter()
        shown: str | dict[str, Any] = arguments

        def result(output: str, error: str | None = None, truncated: bool = False) -> ToolResult:
            return ToolResult(
                call_id=call_id,
                name=name,
                arguments=shown,
                output=output,
                error=error,
                truncated=truncated,
                latency_ms=(time.perf_counter() - start) * 1000,
            )

        tool = self._tools.get(name)
        if tool is None:
            msg = f"Error: unknown tool {name!r}. Available tools: {', '.join(self.names)}."
            return result(msg, "unknown_tool")
        try:
            raw = json.loads(arguments) if isinstance(arguments, str) else arguments
            args = tool.Args.model_validate(raw)
        except (json.JSONDecodeError, ValidationError) as exc:
            shown = _clip(arguments)
            return result(
                f"Error: invalid arguments for {name}: {_short(exc)}", "invalid_arguments"
            )
        except (RecursionError, ValueError, TypeError):  # nested past any parser's depth
            shown = _clip(arguments)
            return result(
                f"Error: invalid arguments for {name}: nested too deeply or malformed.",
                "invalid_arguments",
            )
        try:
            output = await asyncio.wait_for(
                tool.run(args), timeout=tool.timeout_s + tool.start_allowance_s
            )
        except TimeoutError:
            return result(f"Error: {name} timed out after {tool.timeout_s:g} s.", "timeout")
        except ToolError as exc:
            return result(f"Error: {exc}", "tool_error")
        except Exception as exc:  # a broken tool must not crash the run (RecursionError too)
            log.warning("tool %s raised %s", name, type(exc).__name__, exc_info=exc)
            return result(f"Error: {name} failed ({type(exc).__name__}).", "exception")
        output = str(output)
        if len(output) > tool.max_output_chars:
            kept = output[: tool.max_output_chars]
            note = (
                f"\n[output truncated: {len(output)} characters, showing {tool.max_output_chars}]"
            )
            return result(kept + note, None, truncated=True)
        return result(output)


def _clip(arguments: str | dict[str, Any], limit: int = 2000) -> str:
    """Arguments that did not parse, kept as (at most `limit` characters of) their text."""
    if isinstance(arguments, str):
        return arguments[:limit]
    try:
        return json.dumps(arguments)[:limit]
    except (RecursionError, ValueError, TypeError):
        return repr(type(arguments))


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)
