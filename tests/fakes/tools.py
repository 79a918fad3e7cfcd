"""Small tools for graph tests: one that works, ones that raise, hang or flood, a verifier."""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from tools.base import CpuTool, Tool


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


class Spin(CpuTool):
    """Computes forever: only a timeout that kills its worker stops it."""

    name = "spin"
    description = "Spins."
    Args = NoArgs
    timeout_s = 1.0

    @staticmethod
    def compute(args: NoArgs) -> str:
        while True:
            pass


class Hog(CpuTool):
    """Asks for 4 GiB: the worker's address-space cap refuses it."""

    name = "hog"
    description = "Allocates."
    Args = NoArgs

    @staticmethod
    def compute(args: NoArgs) -> str:
        return str(len(bytearray(4 << 30)))


class Recurse(CpuTool):
    """Recurses without end: a RecursionError in the worker."""

    name = "recurse"
    description = "Recurses."
    Args = NoArgs

    @staticmethod
    def compute(args: NoArgs) -> str:
        def down(n: int) -> int:
            return down(n + 1)

        return str(down(0))


class FlagArgs(BaseModel):
    path: str


class SpinUntil(CpuTool):
    """Computes without yielding until a file exists: proof of what ran while it did."""

    name = "spin_until"
    description = "Spins until a file appears."
    Args = FlagArgs
    timeout_s = 120.0

    @staticmethod
    def compute(args: FlagArgs) -> str:
        while not os.path.exists(args.path):
            pass
        return "released"


class PageArgs(BaseModel):
    page: str


class FetchPage(Tool):
    """Returns a page from `pages` (a test plants instructions in them)."""

    name = "fetch_page"
    description = "Fetch a page by name."
    Args = PageArgs

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages

    async def run(self, args: PageArgs) -> str:
        return self.pages.get(args.page, "no such page")
