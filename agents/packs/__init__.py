"""Agent packs: deployable domains, each its agents, its users' tasks and an answer verifier.

`tutoring` serves `tutor` (ReAct + calculator) and `tutor_hints` (Socratic hint mode);
`medical` serves `triage` (Reflexion + kb_search over `kb/medical`, checked by the triage
rules). A team's own pack is named `module:attr`: a `Pack`, or a function returning one.
`get_pack(ref)` gives the whole `Pack` (tasks and verifier too: the eval gate and the simulated
users use those), `load_packs(refs)` the agents to serve; both resolve names the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from agents.packs.base import Pack
from agents.runtime import AgentSpec

KB_DIR = Path(__file__).parent / "kb"


class PackNotFound(ValueError):
    """A pack reference names no pack; the message says what was wrong and how to name one."""


def _tutoring(source: str, eval_size: int) -> Pack:
    from agents.packs.tutoring import tutoring_pack

    return tutoring_pack(source, eval_size)


def _medical(source: str, eval_size: int) -> Pack:
    from agents.packs.medical import pack

    return pack()


# built-in packs, each built from the tutoring options (only the tutoring pack reads them)
PACKS: dict[str, Callable[[str, int], Pack]] = {"tutoring": _tutoring, "medical": _medical}
HOW_TO_NAME = (
    f"built-in packs are {', '.join(sorted(PACKS))}; a team's own pack is named "
    "'module:attr', a Pack or a function returning one (e.g. 'myteam.packs:support')"
)


def get_pack(
    ref: str, *, tutoring_source: str = "templates", tutoring_eval_size: int = 480
) -> Pack:
    """The pack `ref` names: a built-in name or `module:attr`; PackNotFound saying why not.

    `tutoring_source` and `tutoring_eval_size` shape the built-in tutoring pack's problems
    (the learner's ARLOOP_TUTORING_SOURCE / ARLOOP_TUTORING_EVAL_SIZE).
    """
    if ":" not in ref:
        if ref not in PACKS:
            raise PackNotFound(f"unknown agent pack {ref!r}: {HOW_TO_NAME}")
        return PACKS[ref](tutoring_source, tutoring_eval_size)
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PackNotFound(f"agent pack {ref!r}: cannot import {module_name} ({exc})") from exc
    found = getattr(module, attr, None) if attr else None
    value = found() if callable(found) and not isinstance(found, Pack) else found
    if not isinstance(value, Pack):
        raise PackNotFound(f"agent pack {ref!r}: {module_name}.{attr} is not a Pack; {HOW_TO_NAME}")
    return value


def load_packs(refs: list[str]) -> list[AgentSpec]:
    """The agents of the packs `refs` name (see `get_pack`); PackNotFound for a bad one."""
    return [agent for ref in refs for agent in get_pack(ref).agents]


def tutor() -> AgentSpec:
    """The maths tutor of the tutoring pack."""
    from agents.packs.tutoring import tutor as make

    return make()


def triage() -> AgentSpec:
    """The triage assistant of the medical pack."""
    from agents.packs.medical import triage as make

    return make()
