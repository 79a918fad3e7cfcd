"""The LangGraph tutor's pack: `ARLOOP_EVAL_PACKS='["tests.examples.langgraph_tutor.pack:pack"]'`."""

from __future__ import annotations

from agents.packs.base import Pack, Task
from agents.packs.tutoring import EVAL_POOL
from tests.examples.langgraph_tutor.agent import chat_model, solve
from tests.examples.tutor_pack import tutor_pack

NAME = "langgraph-tutor"


def run(task: Task, base_url: str, model: str, headers: dict[str, str]) -> str:
    """The team's graph on one task, its model pointed where the gate says."""
    return solve(chat_model(base_url, "gate", model, headers), task.input)[0]


def pack(tutoring_eval_size: int = EVAL_POOL) -> Pack:
    return tutor_pack(NAME, run, tutoring_eval_size)
