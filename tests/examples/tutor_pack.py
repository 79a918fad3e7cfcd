"""The small pack both examples share (arloop's side): the tutor's word problems and verifier
(`agents.packs.tutoring`), how answers read, and the team's `run`; no `AgentSpec`."""

from __future__ import annotations

from agents.packs.base import Pack, Split, Task, TeamRun
from agents.packs.tutoring import EVAL_POOL, problems, verify
from tools.verifiers import final_number, mentioned_number


def tutor_pack(name: str, run: TeamRun, eval_size: int = EVAL_POOL) -> Pack:
    """A team's tutor, named `name` (its `X-Arloop-Agent`), judged by calling `run`."""

    def tasks(split: Split) -> list[Task]:
        return [
            Task(p.id, name, p.question, p.answer, "calculator", {"kind": p.kind})
            for p in problems(split, "templates", eval_size)
        ]

    return Pack(
        name,
        tasks=tasks,
        verify=verify,
        answer_of=final_number,
        reference_from=mentioned_number,
        run=run,
    )
