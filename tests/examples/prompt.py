"""The examples' prompt, as a team writes one for a small model: what to do, and one worked
example in OpenAI's chat messages (question, calculator call, result, answer). A 135M model
copies the example's pattern; a description alone rarely gets it to call a tool or to end with
`#### <number>` (measured on `arloop demo` with the LangGraph tutor: 0 of 32 answers solved
without it). Free of names, so a PHI scrubber leaves it as written."""

from __future__ import annotations

SYSTEM = (
    "You are a maths tutor. Solve the student's problem. Use the calculator tool for "
    "arithmetic. When you know the answer, end with a line '#### <number>'."
)
EXAMPLE: list[dict] = [
    {
        "role": "user",
        "content": "A farmer has 42 apples and sells 12 of them. How many apples "
        "does the farmer have left?",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "42-12"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_example", "content": "30"},
    {"role": "assistant", "content": "The answer is 30.\n#### 30"},
]
