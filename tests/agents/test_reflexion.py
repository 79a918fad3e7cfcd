"""The Reflexion graph: evaluate, reflect, retry, and recall the reflection in a later run."""

from __future__ import annotations

from agents.events import AnswerPath, ModelStep, RunStatus, ToolStep
from agents.guard import UNCHECKED
from agents.memory import LongTermMemory
from agents.policy_client import PolicyConfig
from agents.reflexion import CHECK_PROMPT, REFLECT_PROMPT
from agents.runtime import AgentRuntime, AgentSpec
from tests.fakes.scripted_llm import Reply
from tests.fakes.tools import Add, ExpectVerifier

SYSTEM = "You solve sums."
LESSON = "I answered before adding: always call the add tool for sums."


def runtime(aredis, llm, *specs: AgentSpec) -> AgentRuntime:
    policy = PolicyConfig(model="openai/arloop", api_base=llm.base_url, api_key="k", retries=0)
    return AgentRuntime.on_redis(aredis, list(specs), policy)


def solver(**kw) -> AgentSpec:
    spec = {
        "name": "solver",
        "description": "d",
        "system_prompt": SYSTEM,
        "kind": "reflexion",
        "tools": (Add(),),
        "task_kind": "arithmetic",
        "verifier": ExpectVerifier("5"),
    }
    return AgentSpec(**(spec | kw))


async def test_failed_attempt_reflects_retries_and_passes(aredis, llm):
    llm.push(
        Reply(content="It is 4."),  # attempt 1: wrong
        Reply(content=LESSON),  # the reflection
        Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]),  # attempt 2
        Reply(content="It is 5."),
    )
    event = await runtime(aredis, llm, solver()).run("solver", "What is 2 plus 3?", "u1")

    assert event.output == "It is 5."
    assert [(type(s).__name__, getattr(s, "name", "")) for s in event.steps] == [
        ("ModelStep", ""),
        ("ToolStep", "expect"),
        ("ModelStep", ""),
        ("ModelStep", ""),
        ("ToolStep", "add"),
        ("ModelStep", ""),
        ("ToolStep", "expect"),
    ]
    first_check, second_check = [s for s in event.tool_steps if s.name == "expect"]
    assert first_check.output == "FAIL: expected 5" and second_check.output == "PASS"
    assert first_check.arguments == {"question": "What is 2 plus 3?", "answer": "It is 4."}
    reflection_request = llm.requests[1]
    assert reflection_request["messages"][0]["content"] == REFLECT_PROMPT
    assert "tools" not in reflection_request
    retry = llm.requests[2]["messages"][-1]
    assert retry["role"] == "user" and LESSON in retry["content"]
    assert "FAIL: expected 5" in retry["content"]
    assert event.metadata == {"arloop.verdict": "pass", "arloop.attempts": "2"}

    memory = LongTermMemory(aredis)
    [stored] = await memory.recall("u1", "arithmetic", "reflection", "2 plus 3")
    assert stored.text == LESSON and stored.source == "What is 2 plus 3?"


async def test_a_later_run_recalls_the_reflection_for_that_user_and_task_kind(aredis, llm):
    memory = LongTermMemory(aredis)
    await memory.add("u1", "arithmetic", "reflection", LESSON, "What is 2 plus 3?")
    await memory.add("u1", "arithmetic", "reflection", "Spell names as the user does.", "names")
    rt = runtime(aredis, llm, solver(), solver(name="other", task_kind="spelling"))
    llm.responder = lambda request: Reply(content="5")

    await rt.run("solver", "What is 7 plus 8?", "u1")  # same user, same kind: recalled
    await rt.run("solver", "What is 7 plus 8?", "u2")  # another user: not
    await rt.run("other", "What is 7 plus 8?", "u1")  # another task kind: not

    prompts = [r["messages"][0]["content"] for r in llm.requests]
    assert prompts[0].startswith(SYSTEM) and LESSON in prompts[0]
    assert "Spell names" not in prompts[0]  # only what bears on the question
    assert prompts[1] == SYSTEM and prompts[2] == SYSTEM


async def test_without_a_verifier_the_model_checks_itself_and_retries_are_bounded(aredis, llm):
    def respond(request):
        system = request["messages"][0]["content"]
        if system == CHECK_PROMPT:
            return Reply(content="FAIL: the answer does not say which.")
        if system == REFLECT_PROMPT:
            return Reply(content="Say which one next time.")
        return Reply(content="Maybe.")

    llm.responder = respond
    event = await runtime(aredis, llm, solver(verifier=None, max_attempts=3)).run(
        "solver", "Which is larger, 2 or 3?", "u1"
    )

    assert all(isinstance(s, ModelStep) for s in event.steps)
    systems = [r["messages"][0]["content"] for r in llm.requests]
    answer, check, reflect = SYSTEM, CHECK_PROMPT, REFLECT_PROMPT
    assert systems[0].startswith(answer) and systems[1:3] == [check, reflect]
    assert [s if not s.startswith(SYSTEM) else answer for s in systems] == [
        answer,
        check,
        reflect,
        answer,
        check,
        reflect,
        answer,
        check,
    ]
    assert event.metadata == {"arloop.verdict": "fail", "arloop.attempts": "3"}
    # the last attempt failed its check: never returned, the trajectory keeps it apart
    assert event.output == UNCHECKED and event.model_output == "Maybe."
    assert event.answered_by is AnswerPath.FALLBACK and event.status is RunStatus.FALLBACK
    lessons = await LongTermMemory(aredis).recall("u1", "arithmetic", "reflection", "which larger")
    assert [m.text for m in lessons] == ["Say which one next time."] * 2


async def test_a_broken_verifier_stops_without_retrying(aredis, llm):
    class Broken(ExpectVerifier):
        async def run(self, args):
            raise RuntimeError("verifier down")

    llm.push(Reply(content="5"))
    event = await runtime(aredis, llm, solver(verifier=Broken("5"))).run("solver", "2+3?", "u1")
    assert len(llm.requests) == 1
    assert isinstance(event.steps[-1], ToolStep) and event.steps[-1].error == "exception"
    assert event.metadata["arloop.verdict"] == "error"
    assert event.output == UNCHECKED and event.answered_by is AnswerPath.FALLBACK
