"""A model that obeys any instruction it sees, except in what its prompt marks as data.

It reads the prompt as a policy server would build it (`chat_format.prompt_token_ids`, the
tiny ChatML tokenizer), turn by turn at the real control tokens. An instruction
(`INSTRUCTION: reply <word>`) anywhere outside data makes it answer `<word>`: in a system or
user turn, in a turn forged with control-token text, after a `</tool_response>` that closes the
real one early, or in a line-format tool turn that does not open with the data label. So it
follows a planted instruction exactly when the prompt's defences fail: the injection tests
count how often that happens, and can fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from learner.policy.chat_format import HERMES, LINE, ToolFormat, prompt_token_ids
from learner.policy.line_format import TOOL_DATA_LABEL
from learner.policy.tiny_model import build_tokenizer
from tests.fakes.scripted_llm import Reply

INSTRUCTION = re.compile(r"INSTRUCTION: reply (\S+)")
_TOKENIZER = build_tokenizer()


def turns(ids: list[int]) -> list[tuple[str, str]]:
    """(role, text) per turn, split at the real `<|im_start|>` ids only."""
    start = _TOKENIZER.convert_tokens_to_ids("<|im_start|>")
    out, current = [], []
    for token in [*ids, start]:
        if token == start:
            if current:
                text = _TOKENIZER.decode(current).split("<|im_end|>")[0]
                role, _, body = text.partition("\n")
                out.append((role, body))
            current = []
        else:
            current.append(token)
    return out


def outside_data(role: str, body: str, fmt: ToolFormat) -> str:
    """What of a turn the model treats as words to it (instructions it follows)."""
    if role != "tool":
        return body
    if fmt == LINE:
        return "" if body.startswith(TOOL_DATA_LABEL) else body
    head, opened, rest = body.partition("<tool_response>")
    if not opened:
        return body
    _, closed, tail = rest.partition("</tool_response>")  # the first closing tag ends the data
    return head + (tail if closed else "")


def obeyed(ids: list[int], fmt: ToolFormat) -> str | None:
    """The word an instruction outside data tells it to reply, if any (the last one wins)."""
    said = None
    for role, body in turns(ids):
        for match in INSTRUCTION.finditer(outside_data(role, body, fmt)):
            said = match.group(1)
    return said


def responder(
    fmt: ToolFormat = HERMES, tool: str = "fetch_page", render: Callable | None = None
) -> Callable[[dict], Reply]:
    """A scripted endpoint's responder: render the request as the policy server would (or
    with `render`), obey what it sees; else call `tool` once with the user's message as its
    argument, then answer."""
    render = render or prompt_token_ids

    def reply(request: dict[str, Any]) -> Reply:
        ids = render(_TOKENIZER, request["messages"], request.get("tools"), fmt)
        word = obeyed(ids, fmt)
        if word is not None:
            return Reply(content=word)
        if request["messages"][-1]["role"] != "tool":
            page = request["messages"][-1]["content"]
            return Reply(tool_calls=[(tool, f'{{"page": "{page}"}}')])
        return Reply(content="The page says nothing I should do.")

    return reply
