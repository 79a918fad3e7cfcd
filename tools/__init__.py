"""Typed, sandboxed tools: the protocol, the registry and the built-ins."""

from tools.base import CpuTool, Tool, ToolError, ToolResult
from tools.calculator import Calculator
from tools.kb_search import KbSearch
from tools.registry import ToolRegistry

__all__ = ["Calculator", "CpuTool", "KbSearch", "Tool", "ToolError", "ToolRegistry", "ToolResult"]
