"""Agent packs: deployable domains, each its agents, its users' tasks and an answer verifier.

`tutoring` serves `tutor` (ReAct + calculator) and `tutor_hints` (Socratic hint mode);
`medical` serves `triage` (Reflexion + kb_search over `kb/medical`, checked by the triage
rules). `load_packs(names)` gives the agents to serve, `get_pack(name)` the whole `Pack`
(tasks and verifier too: the eval gate and the simulated users use those).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agents.packs.base import Pack
from agents.runtime import AgentSpec

KB_DIR = Path(__file__).parent / "kb"


def _tutoring() -> Pack:
    from agents.packs.tutoring import pack

    return pack()


def _medical() -> Pack:
    from agents.packs.medical import pack

    return pack()


PACKS: dict[str, Callable[[], Pack]] = {"tutoring": _tutoring, "medical": _medical}


def get_pack(name: str) -> Pack:
    """The named pack; ValueError naming the known packs for an unknown one."""
    if name not in PACKS:
        raise ValueError(f"unknown agent pack {name!r}; known packs: {sorted(PACKS)}")
    return PACKS[name]()


def load_packs(names: list[str]) -> list[AgentSpec]:
    """The agents of the named packs; ValueError naming the known packs for an unknown one."""
    unknown = [n for n in names if n not in PACKS]
    if unknown:
        raise ValueError(f"unknown agent pack(s) {unknown}; known packs: {sorted(PACKS)}")
    return [agent for n in names for agent in get_pack(n).agents]


def tutor() -> AgentSpec:
    """The maths tutor of the tutoring pack."""
    from agents.packs.tutoring import tutor as make

    return make()


def triage() -> AgentSpec:
    """The triage assistant of the medical pack."""
    from agents.packs.medical import triage as make

    return make()
