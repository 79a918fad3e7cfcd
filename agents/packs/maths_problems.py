"""The tutoring pack's problems: one-step template word problems, and a GSM8K subset.

Template problems (add, subtract, multiply, divide with two-digit numbers) are what a
135M-parameter model can learn to solve with a calculator in minutes on a CPU; GSM8K problems
(one or two steps) are mostly beyond it, and are there for larger models. Every eval problem
is held out: the template eval set is drawn with its own seed and its number pairs are never
drawn for training; GSM8K's eval split is fixed in `data/gsm8k/subset.jsonl`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

GSM8K_FILE = Path(__file__).parent / "data" / "gsm8k" / "subset.jsonl"
EVAL_SEED = 1
NAMES = ("Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Omar", "Zoe", "Raj", "Emma", "Leo", "Nina")
ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "books",
    "cookies",
    "cards",
    "shells",
    "coins",
    "balloons",
)


@dataclass(frozen=True)
class Problem:
    """A word problem, its numeric answer, and the calculator expression that solves it."""

    id: str
    question: str
    answer: str
    expression: str
    kind: str
    source: str  # "template" | "gsm8k"


_TEMPLATES: dict[str, tuple[str, Callable[[int, int], int], str]] = {
    "add": (
        "{n} has {a} {i} and buys {b} more. How many {i} does {n} have now?",
        lambda a, b: a + b,
        "{a}+{b}",
    ),
    "sub": (
        "{n} had {a} {i} and gave {b} of them to a friend. How many {i} does {n} have left?",
        lambda a, b: a - b,
        "{a}-{b}",
    ),
    "mul": (
        "{n} buys {a} boxes with {b} {i} in each box. How many {i} does {n} buy in total?",
        lambda a, b: a * b,
        "{a}*{b}",
    ),
    "div": (
        "{n} shares {a} {i} equally among {b} friends. How many {i} does each friend get?",
        lambda a, b: a // b,
        "{a}/{b}",
    ),
}
KINDS = tuple(_TEMPLATES)


def _operands(rng: random.Random, kind: str) -> tuple[int, int]:
    if kind == "add":
        return rng.randint(11, 99), rng.randint(11, 99)
    if kind == "sub":
        a = rng.randint(30, 99)
        return a, rng.randint(11, a - 5)
    if kind == "mul":
        return rng.randint(3, 19), rng.randint(11, 49)
    b = rng.randint(3, 12)
    return b * rng.randint(11, 40), b


def template_problem(rng: random.Random, kind: str | None = None) -> Problem:
    """One random template problem (of `kind`, or of a random kind)."""
    kind = kind or rng.choice(KINDS)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = _operands(rng, kind)
    text, solve, expression = _TEMPLATES[kind]
    return Problem(
        id=f"{kind}-{a}-{b}",
        question=text.format(n=name, a=a, b=b, i=item),
        answer=str(solve(a, b)),
        expression=expression.format(a=a, b=b),
        kind=kind,
        source="template",
    )


def template_eval(n: int, seed: int = EVAL_SEED) -> list[Problem]:
    """The held-out template problems: the first `n` of a seeded draw, the kinds in turn (so
    any prefix is balanced), no number pair twice."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        p = template_problem(rng, KINDS[len(out) % len(KINDS)])
        if p.id not in seen:
            seen.add(p.id)
            out.append(p)
    return out


def template_train(n: int, seed: int, held_out: set[str]) -> list[Problem]:
    """`n` training problems drawn with `seed`, skipping every (kind, numbers) held out."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        p = template_problem(rng)
        if p.id not in held_out:
            out.append(p)
    return out


@cache
def gsm8k(split: str) -> tuple[Problem, ...]:
    """The GSM8K subset's problems of one split (`train` or `eval`)."""
    out = []
    for line in GSM8K_FILE.open(encoding="utf-8"):
        row = json.loads(line)
        if row["split"] == split:
            steps = row["answer"].count("<<")
            out.append(
                Problem(
                    id=row["id"],
                    question=row["question"],
                    answer=gsm8k_answer(row["answer"]),
                    expression=_first_expression(row["answer"]),
                    kind=f"gsm8k-{steps}step",
                    source="gsm8k",
                )
            )
    return tuple(out)


def gsm8k_answer(solution: str) -> str:
    """The number after GSM8K's `####`, without thousands separators."""
    return solution.split("####")[-1].strip().replace(",", "")


def _first_expression(solution: str) -> str:
    start = solution.find("<<")
    return solution[start + 2 : solution.find("=", start)] if start >= 0 else ""
