"""The tool protocol: a name, a description, a pydantic argument model, and an async call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel

from tools.worker import START_TIMEOUT_S, shared_pool


class ToolError(Exception):
    """A failure the model should read and can act on (bad argument, nothing found, ...)."""


class Tool(ABC):
    """Subclass with `name`, `description`, `Args`, and `run`; the sandbox does the rest."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    timeout_s: ClassVar[float] = 5.0
    max_output_chars: ClassVar[int] = 4000
    start_allowance_s: ClassVar[float] = 0.0
    """Time the sandbox allows beyond `timeout_s` before the work starts (a worker's start)."""

    @abstractmethod
    async def run(self, args: BaseModel) -> str:
        """Do the work; raise ToolError with a message for the model when it cannot."""

    def spec(self) -> dict[str, Any]:
        """The OpenAI `tools` entry: the argument model's JSON schema as parameters."""
        schema = self.Args.model_json_schema()
        schema.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": schema},
        }


class CpuTool(Tool):
    """A tool whose work is synchronous computation: `compute(args)` runs in a worker process
    that is killed when `timeout_s` passes (`tools.worker`), so a runaway call stops for real
    and the event loop never waits on it. `compute` must be a staticmethod (it is pickled by
    name) and may raise ToolError."""

    start_allowance_s: ClassVar[float] = START_TIMEOUT_S

    @staticmethod
    @abstractmethod
    def compute(args: Any) -> str:
        """The work, in the worker process."""

    async def run(self, args: BaseModel) -> str:
        return await shared_pool().run(type(self).compute, args, self.timeout_s)


class ToolResult(BaseModel):
    """What one sandboxed call produced: the observation text the model will see."""

    call_id: str
    name: str
    arguments: dict[str, Any] | str
    output: str
    error: str | None = None
    truncated: bool = False
    latency_ms: float
