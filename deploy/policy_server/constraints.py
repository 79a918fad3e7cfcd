"""Constrained decoding with llguidance: `response_format` and a forced `tool_choice` as a
grammar whose token mask each row applies before it chooses (both engines: `rows.step`).

- `response_format` `json_object`: any JSON object; `json_schema`: one matching the schema.
- `tool_choice` `required`: one call (or, with `parallel_tool_calls`, several) of the
  request's tools in the server's tool format, each call's arguments matching the tool's
  `parameters`; a named function: a call of that function.
The logprobs a row records stay the model's own, unmasked (what the learner recomputes).
"""

from __future__ import annotations

import importlib.util
import json
import weakref
from collections.abc import Callable
from typing import Any

import torch

from deploy.policy_server.openai_wire import ChatRequest, OpenAIError
from learner.policy.chat_format import ToolFormat
from learner.policy.line_format import main_parameter

INSTALL = "pip install 'arloop[learn]' (llguidance)"
_WRAPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def constraint_factory(
    req: ChatRequest, tokenizer: Any, tool_format: ToolFormat
) -> Callable[[], GrammarConstraint] | None:
    """A maker of one fresh constraint per row, or None when the request constrains nothing.

    A grammar that does not compile is a 400 naming the parameter, here, before any row runs.
    """
    grammar, param = _grammar(req, tool_format)
    if grammar is None:
        return None
    if importlib.util.find_spec("llguidance") is None:
        raise OpenAIError(400, f"{param} needs constrained decoding: {INSTALL}", param=param)
    import llguidance

    wrapped = _wrapped(tokenizer)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, wrapped)
    if failed:
        why = "; ".join(messages)[:300]
        raise OpenAIError(400, f"{param} cannot be enforced: {why}", param=param)
    return lambda: GrammarConstraint(wrapped, grammar)


class GrammarConstraint:
    """One row's llguidance matcher: the allowed next tokens, advanced by each chosen one."""

    def __init__(self, wrapped: Any, grammar: str) -> None:
        import llguidance
        import llguidance.torch

        self.matcher = llguidance.LLMatcher(wrapped, grammar)
        self.eos = wrapped.eos_token
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, wrapped.vocab_size)
        self._fill = llguidance.torch.fill_next_token_bitmask
        self.bits = torch.arange(32, dtype=torch.int32)

    def allowed(self, vocab: int) -> torch.Tensor:
        mask = torch.zeros(vocab, dtype=torch.bool)
        if not self.matcher.is_error():
            self._fill(self.matcher, self.bitmask, 0)
            unpacked = ((self.bitmask[0, :, None] >> self.bits) & 1).bool().flatten()
            n = min(vocab, unpacked.numel())
            mask[:n] = unpacked[:n]
        if not mask.any():  # a dead end (or the grammar is done): end the row
            mask[self.eos] = True
        return mask

    def advance(self, token: int) -> bool:
        if not self.matcher.is_error() and token != self.eos:
            self.matcher.consume_token(token)
        return self.matcher.is_stopped() or self.matcher.is_error()


def _wrapped(tokenizer: Any) -> Any:
    import llguidance.hf

    wrapped = _WRAPPED.get(tokenizer)
    if wrapped is None:
        wrapped = llguidance.hf.from_tokenizer(tokenizer)
        _WRAPPED[tokenizer] = wrapped
    return wrapped


def _grammar(req: ChatRequest, fmt: ToolFormat) -> tuple[str | None, str]:
    """(llguidance grammar, the parameter it enforces) or (None, "")."""
    forced = req.tool_choice == "required" or not isinstance(req.tool_choice, str | None)
    fmt_kind = req.response_format.type if req.response_format else "text"
    if forced and fmt_kind != "text":
        raise OpenAIError(
            400,
            "tool_choice forces a tool call, response_format a JSON reply: send one of them",
            param="response_format",
        )
    if forced:
        return _tool_grammar(req, fmt), "tool_choice"
    if fmt_kind == "json_object":
        return _json_grammar({"type": "object"}), "response_format"
    if fmt_kind == "json_schema":
        spec = req.response_format.json_schema
        if spec is None:
            raise OpenAIError(
                400, "response_format json_schema needs its `json_schema`", param="response_format"
            )
        return _json_grammar(spec.json_schema or {"type": "object"}), "response_format"
    return None, ""


def _json_grammar(schema: dict[str, Any]) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(_compact(schema))


def _compact(schema: dict[str, Any]) -> dict[str, Any]:
    """JSON written as OpenAI writes it (`, ` and `: `, no other whitespace): a model cannot
    loop on newlines between tokens the schema fixes."""
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return {**schema, "x-guidance": {**options, **schema.get("x-guidance", {})}}


def _tool_grammar(req: ChatRequest, fmt: ToolFormat) -> str:
    tools = {t.function.name: t.function for t in req.tools or []}
    if not tools:
        raise OpenAIError(
            400, "tool_choice forces a call but `tools` is empty", param="tool_choice"
        )
    names = list(tools)
    if not isinstance(req.tool_choice, str):
        name = req.tool_choice.function.name
        if name not in tools:
            raise OpenAIError(
                400, f"tool_choice names {name!r}, which is not in `tools`", param="tool_choice"
            )
        names = [name]
    if fmt == "line":  # `CALL name: argument`, one call a turn (the server stops after it)
        alternatives = " | ".join(_line_call(tools[n].model_dump(), n) for n in names)
        return _lark(f"start: {alternatives}\n")
    schema = _compact(
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": n},
                        "arguments": tools[n].parameters or {"type": "object"},
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for n in names
            ]
        }
    )
    repeat = ' ("\\n" call)*' if req.parallel_tool_calls else ""
    return _lark(
        f"start: call{repeat}\n"
        f'call: "<tool_call>" body "</tool_call>"\n'
        f"body: %json {json.dumps(schema)}\n"
    )


def _line_call(function: dict[str, Any], name: str) -> str:
    """One tool's call line: its main argument as the line format writes it (60 characters at
    most), or nothing for a tool without one; the newline ends the row."""
    if main_parameter(function) is None:
        return f'({json.dumps(f"CALL {name}:")} "\\n")'
    return f'({json.dumps(f"CALL {name}: ")} /[A-Za-z0-9][^\\n]{{0,60}}/ "\\n")'


def _lark(text: str) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(text)
