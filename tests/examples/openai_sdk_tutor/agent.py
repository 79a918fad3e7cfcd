"""The tutor as a team writes it with the OpenAI SDK: ask, run the calculator calls the model
writes, ask again, at most `MAX_CALLS` times; the answer ends with `#### <number>`. Nothing of
arloop here: the client's base URL, model and headers say where it runs."""

from __future__ import annotations

from openai import OpenAI

from tests.examples.calculator import SPEC, call
from tests.examples.prompt import EXAMPLE, SYSTEM

MAX_CALLS = 3


def solve(client: OpenAI, question: str, model: str = "arloop") -> tuple[str, dict[str, str]]:
    """(the answer, the last response's headers): a tool loop of at most MAX_CALLS calls."""
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        *EXAMPLE,
        {"role": "user", "content": question},
    ]
    for _ in range(MAX_CALLS):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, tools=[SPEC]
        )
        message = raw.parse().choices[0].message
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for c in message.tool_calls:
            result = call(c.function.arguments) if c.function.name == "calculator" else "error"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    return message.content or "", dict(raw.headers)
