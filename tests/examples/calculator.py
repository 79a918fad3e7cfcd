"""The examples' calculator: the team's own tool, arithmetic only (no `eval`)."""

from __future__ import annotations

import ast
import json
import operator

SPEC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as '42-12' or '(3+4)*5'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression."}},
            "required": ["expression"],
        },
    },
}
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """The value of `expression` (`30`, `2.5`), or `error: ...` for anything else."""
    try:
        value = _value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def call(arguments: str | None) -> str:
    """A model's tool call (JSON arguments) run, or what was wrong with it."""
    try:
        expression = json.loads(arguments or "{}").get("expression", "")
    except (json.JSONDecodeError, AttributeError):
        return "error: arguments must be a JSON object with an 'expression'"
    return calculate(str(expression))


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.operand))
    raise ValueError("only numbers and + - * / ( )")
