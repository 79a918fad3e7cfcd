"""The OpenAI-SDK tutor's pack: `ARLOOP_EVAL_PACKS='["tests.examples.openai_sdk_tutor.pack:pack"]'`."""

from __future__ import annotations

from openai import OpenAI

from agents.packs.base import Pack, Task
from agents.packs.tutoring import EVAL_POOL
from tests.examples.openai_sdk_tutor.agent import solve
from tests.examples.tutor_pack import tutor_pack

NAME = "sdk-tutor"


def run(task: Task, base_url: str, model: str, headers: dict[str, str]) -> str:
    """The team's agent on one task, pointed where the gate says."""
    client = OpenAI(base_url=base_url, api_key="gate", default_headers=headers, max_retries=0)
    return solve(client, task.input, model)[0]


def pack(tutoring_eval_size: int = EVAL_POOL) -> Pack:
    return tutor_pack(NAME, run, tutoring_eval_size)
