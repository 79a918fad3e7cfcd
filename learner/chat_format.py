"""OpenAI chat messages and tools to a model prompt (Hermes tool format), and tool calls back."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from learner.tiny_model import CHATML_TEMPLATE

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)
_TOOLS_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. "
    "Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags as follows:\n<tool_call>{{"name": <function-name>, '
    '"arguments": <args-dict>}}</tool_call>'
)


class ChatFormatError(ValueError):
    """Messages or tools that cannot become a prompt; `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """The prompt text: the model's chat template over the messages, tools in the system turn."""
    plain = [_plain_message(m, i) for i, m in enumerate(messages)]
    if tools:
        plain = _with_tools(plain, tools)
    template = tokenizer.chat_template or CHATML_TEMPLATE
    try:
        return tokenizer.apply_chat_template(
            plain, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except TemplateError as exc:
        raise ChatFormatError(f"the model's chat template refused the messages: {exc}", "messages")


def prompt_token_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of `render_prompt` (the template writes the special tokens itself)."""
    text = render_prompt(tokenizer, messages, tools)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) from model text; a call that does not parse stays content."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match) -> str:
        call = _parse_call(match.group(1))
        if call is None:
            return match.group(0)
        calls.append(call)
        return ""

    rest = _CALL.sub(take, text)
    if not calls:
        return text, []
    content = rest.strip()
    return content or None, calls


def format_tool_call(name: str, arguments: Any) -> str:
    """One call as the model writes it: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`."""
    return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + CALL_CLOSE


def _parse_call(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args)},
    }


def _plain_message(message: dict[str, Any], index: int) -> dict[str, str]:
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise ChatFormatError(
            f"messages[{index}].role {role!r} is not a chat role", f"messages.{index}.role"
        )
    content = _text(message.get("content"), index)
    if role == "assistant" and message.get("tool_calls"):
        calls = [_call_text(c, index, j) for j, c in enumerate(message["tool_calls"])]
        content = "\n".join(([content] if content else []) + calls)
    if role == "tool":
        content = f"<tool_response>\n{content}\n</tool_response>"
    return {"role": "system" if role == "developer" else role, "content": content}


def _text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ChatFormatError(
                    "only text content parts are supported", f"messages.{index}.content.{j}"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ChatFormatError(
        "content must be a string or a list of text parts", f"messages.{index}.content"
    )


def _call_text(call: dict[str, Any], index: int, j: int) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatFormatError(
            "a tool call needs function.name", f"messages.{index}.tool_calls.{j}.function"
        )
    args = fn.get("arguments") or "{}"
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        parsed = args  # keep what the client sent; the model saw it that way
    return format_tool_call(fn["name"], parsed)


def _with_tools(
    messages: list[dict[str, str]], tools: Sequence[dict[str, Any]]
) -> list[dict[str, str]]:
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatFormatError("a tool needs type 'function' and function.name", f"tools.{i}")
        specs.append(json.dumps(fn))
    block = _TOOLS_PREAMBLE.format(tools="\n".join(specs))
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
