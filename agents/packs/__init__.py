"""Agent packs: the agents a deployment serves, as data (prompt, tools, loop, budgets).

Placeholders until the packs are fleshed out: `tutoring` serves `tutor` (ReAct with the
calculator) and `medical` serves `triage` (Reflexion with kb_search over `kb/medical`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agents.runtime import AgentSpec

KB_DIR = Path(__file__).parent / "kb"


def tutor() -> AgentSpec:
    """A maths tutor that checks arithmetic with the calculator."""
    from tools.calculator import Calculator

    return AgentSpec(
        name="tutor",
        description="Maths tutor: explains step by step and checks arithmetic with a calculator.",
        system_prompt=(
            "You are a patient maths tutor. Explain the method in short steps. Use the "
            "calculator tool for any arithmetic instead of computing in your head, then give "
            "the final answer on its own line."
        ),
        kind="react",
        tools=(Calculator(),),
        task_kind="tutoring",
        max_steps=6,
    )


def triage() -> AgentSpec:
    """A medical-information triage assistant grounded in a small knowledge base."""
    from tools.kb_search import KbSearch

    return AgentSpec(
        name="triage",
        description="Medical-information triage: looks up guidance and says when to seek care.",
        system_prompt=(
            "You are a medical-information assistant, not a doctor. Search the knowledge base "
            "before answering, cite the source you used, say plainly when someone should seek "
            "urgent care, and never give a diagnosis."
        ),
        kind="reflexion",
        tools=(KbSearch(KB_DIR / "medical"),),
        task_kind="triage",
        max_steps=4,
        max_attempts=2,
    )


PACKS: dict[str, Callable[[], AgentSpec]] = {"tutoring": tutor, "medical": triage}


def load_packs(names: list[str]) -> list[AgentSpec]:
    """The agents of the named packs; ValueError naming the known packs for an unknown one."""
    unknown = [n for n in names if n not in PACKS]
    if unknown:
        raise ValueError(f"unknown agent pack(s) {unknown}; known packs: {sorted(PACKS)}")
    return [PACKS[n]() for n in names]
