"""Small tools for graph tests: one that works, ones that raise, hang or flood, a verifier."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from tools.base import Tool


class AddArgs(BaseModel):
    a: float
    b: float


class Add(Tool):
    name = "add"
    description = "Add two numbers."
    Args = AddArgs

    async def run(self, args: AddArgs) -> str:
        return f"{args.a + args.b:g}"


class NoArgs(BaseModel):
    pass


class Explode(Tool):
    name = "explode"
    description = "Always raises."
    Args = NoArgs

    async def run(self, args: NoArgs) -> str:
        raise RuntimeError("boom")


class Hang(Tool):
    name = "hang"
    description = "Never answers."
    Args = NoArgs
    timeout_s = 0.2

    async def run(self, args: NoArgs) -> str:
        await asyncio.sleep(30)
        return "too late"


class Flood(Tool):
    name = "flood"
    description = "Answers far too much."
    Args = NoArgs
    max_output_chars = 1000

    async def run(self, args: NoArgs) -> str:
        return "x" * 200_000


class CheckArgs(BaseModel):
    question: str
    answer: str


class ExpectVerifier(Tool):
    """PASS when the answer contains the expected text."""

    name = "expect"
    description = "Checks an answer."
    Args = CheckArgs

    def __init__(self, expected: str) -> None:
        self.expected = expected

    async def run(self, args: CheckArgs) -> str:
        if self.expected in args.answer:
            return "PASS"
        return f"FAIL: expected {self.expected}"
