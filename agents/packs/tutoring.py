"""The tutoring pack: a maths tutor (ReAct + calculator), a Socratic hint mode, its problems.

`tutor` solves the student's word problem with the calculator and ends with `#### <answer>`
(GSM8K's answer format, checked by `tools.verifiers.verify_gsm8k`). It is shown one worked
example on every call (question, calculator call, result, answer): the bundled 135M model
copies that pattern, where a description alone rarely gets it to call a tool. `tutor_hints`
guides instead of telling: one hint or question, never the answer.

Problems: `templates` (one-step word problems; the demo's default), `gsm8k` (a 400-problem
subset of GSM8K, mostly beyond a 135M model), or `mixed`. The held-out eval pool (480 by
default, the kinds in turn) never reaches training; the gate draws from it. `tutoring_pack(
source, eval_size)` builds the pack; the learner passes its settings' ARLOOP_TUTORING_SOURCE
and ARLOOP_TUTORING_EVAL_SIZE. `first_turn` scores the tutor's first call alone: the gate's
cheap sampled form of an eval run.
"""

from __future__ import annotations

import json

from agents.events import ModelStep
from agents.packs.base import Pack, Split, Task
from agents.packs.common import scrub_input
from agents.packs.maths_problems import Problem, gsm8k, template_eval, template_train
from agents.runtime import AgentSpec
from tools.base import ToolError
from tools.calculator import Calculator, calculate
from tools.verifiers import final_number, mentioned_number, same_number, verify_gsm8k

SOURCES = ("templates", "gsm8k", "mixed")
TRAIN_SEED = 1000
TRAIN_SIZE = 2000
EVAL_POOL = 480
"""Held-out problems by default (120 of each template kind): the gate draws from them."""

SYSTEM = (
    "You are a maths tutor. Solve the student's problem. Use the calculator tool for "
    "arithmetic. When you know the answer, end with a line '#### <number>'."
)
HINTS = (
    "You are a maths tutor in hint mode. Do not give the final answer. Reply with one short "
    "hint or one guiding question about the next step, so the student finds it themselves."
)
# Free of names, so the PHI scrubber leaves it (and the token ids logged with it) unchanged.
EXAMPLE = (
    {
        "role": "user",
        "content": "A farmer has 42 apples and sells 12 of them. How many apples "
        "does the farmer have left?",
    },
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "42-12"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_example", "content": "30"},
    {"role": "assistant", "content": "The answer is 30.\n#### 30"},
)


def tutor() -> AgentSpec:
    """The maths tutor: calculator for the arithmetic, `#### <answer>` at the end."""
    return AgentSpec(
        name="tutor",
        description="Maths tutor: solves word problems with a calculator, answer as '#### n'.",
        system_prompt=SYSTEM,
        kind="react",
        tools=(Calculator(),),
        task_kind="tutoring",
        max_steps=3,
        examples=EXAMPLE,
        input_filter=scrub_input,
    )


def tutor_hints() -> AgentSpec:
    """Socratic mode: one hint or guiding question, never the answer."""
    return AgentSpec(
        name="tutor_hints",
        description="Maths tutor, hint mode: guides rather than tells.",
        system_prompt=HINTS,
        kind="react",
        task_kind="tutoring",
        max_steps=1,
        input_filter=scrub_input,
    )


def problems(split: Split, source: str = "templates", eval_size: int = EVAL_POOL) -> list[Problem]:
    """The problems of a split; the eval split never overlaps the training one."""
    if source not in SOURCES:
        raise ValueError(f"tutoring source {source!r} is not one of {', '.join(SOURCES)}")
    if source == "gsm8k":
        return list(gsm8k(split))[:eval_size] if split == "eval" else list(gsm8k("train"))
    if source == "mixed":
        half = eval_size // 2
        if split == "eval":
            return template_eval(eval_size - half) + list(gsm8k("eval"))[:half]
        return _template_train(eval_size - half) + list(gsm8k("train"))
    return template_eval(eval_size) if split == "eval" else _template_train(eval_size)


def _template_train(eval_size: int) -> list[Problem]:
    held_out = {p.id for p in template_eval(max(eval_size, EVAL_POOL))}  # eval may grow to this
    return template_train(TRAIN_SIZE, TRAIN_SEED, held_out)


def task(p: Problem) -> Task:
    return Task(
        id=p.id,
        agent="tutor",
        input=p.question,
        reference=p.answer,
        needs_tool="calculator",
        meta={"kind": p.kind, "source": p.source, "expression": p.expression},
    )


def verify(t: Task, output: str) -> float:
    """1.0 when the reply's `#### <number>` equals the task's answer."""
    return verify_gsm8k(output, t.reference)


def first_turn(t: Task, step: ModelStep) -> float:
    """The tutor's first call alone: 1.0 when its calculator call computes the answer (the
    worked example then copies the result into `#### n`), or when it answers `#### n` right
    away; else 0.0. The model's expression is evaluated by the calculator, never trusted."""
    calls = [c for c in step.tool_calls if c.name == "calculator"]
    if not calls:
        return verify(t, step.output or "")
    try:
        expression = json.loads(calls[0].arguments or "{}").get("expression", "")
        return 1.0 if same_number(calculate(str(expression)), t.reference) else 0.0
    except (ValueError, AttributeError, ToolError):  # bad JSON, not an object, a bad expression
        return 0.0


def tutoring_pack(source: str = "templates", eval_size: int = EVAL_POOL) -> Pack:
    """The pack with problems from `source` and an eval suite of `eval_size` problems."""
    if eval_size < 1:
        raise ValueError("the tutoring eval suite needs at least one problem")

    def tasks(split: Split) -> list[Task]:
        return [task(p) for p in problems(split, source, eval_size)]

    return Pack(
        "tutoring",
        (tutor(), tutor_hints()),
        tasks,
        verify,
        answer_of=final_number,
        reference_from=mentioned_number,
        first_turn=first_turn,
    )


def pack(tutoring_source: str = "templates", tutoring_eval_size: int = EVAL_POOL) -> Pack:
    """The pack's entry point (`arloop.packs`): the learner passes its ARLOOP_TUTORING_SOURCE
    and ARLOOP_TUTORING_EVAL_SIZE by these names (`agents.packs.loading`)."""
    return tutoring_pack(tutoring_source, tutoring_eval_size)
