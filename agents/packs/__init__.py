"""Agent packs: deployable domains, each its agents, its users' tasks and an answer verifier.

`tutoring` serves `tutor` (ReAct + calculator) and `tutor_hints` (Socratic hint mode);
`medical` serves `triage` (Reflexion + kb_search over `kb/medical`, checked by the triage
rules). Both are registered like any team's pack, under the `arloop.packs` entry-point group;
a team's own pack is that, or a `module:attr` string (`agents.packs.loading`). The API a pack
implements is `agents.packs.base.Pack`. `get_pack(ref)` gives the whole `Pack` (tasks and
verifier too: the eval gate and the simulated users use those), `load_packs(refs)` the agents
to serve; both resolve names the same way.
"""

from __future__ import annotations

from pathlib import Path

from agents.packs.base import Pack, Split, Task
from agents.packs.loading import PackNotFound, agents_of, get_pack, load_packs, registered
from agents.runtime import AgentSpec

KB_DIR = Path(__file__).parent / "kb"

__all__ = [
    "KB_DIR",
    "Pack",
    "PackNotFound",
    "Split",
    "Task",
    "agents_of",
    "get_pack",
    "load_packs",
    "registered",
    "triage",
    "tutor",
]


def tutor() -> AgentSpec:
    """The maths tutor of the tutoring pack."""
    from agents.packs.tutoring import tutor as make

    return make()


def triage() -> AgentSpec:
    """The triage assistant of the medical pack."""
    from agents.packs.medical import triage as make

    return make()
