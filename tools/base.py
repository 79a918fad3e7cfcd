"""The tool protocol: a name, a description, a pydantic argument model, and an async call."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel


class ToolError(Exception):
    """A failure the model should read and can act on (bad argument, nothing found, ...)."""


class Tool(ABC):
    """Subclass with `name`, `description`, `Args`, and `run`; the sandbox does the rest."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: ClassVar[type[BaseModel]]
    timeout_s: ClassVar[float] = 5.0
    max_output_chars: ClassVar[int] = 4000

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


class ToolResult(BaseModel):
    """What one sandboxed call produced: the observation text the model will see."""

    call_id: str
    name: str
    arguments: dict[str, Any] | str
    output: str
    error: str | None = None
    truncated: bool = False
    latency_ms: float
