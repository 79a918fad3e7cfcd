"""The sink: one event per run on the stream; scrubbed texts drop the token ids they touch."""

from __future__ import annotations

from agents.events import (
    CASE_KEY,
    STREAM_TRAJECTORIES,
    ModelStep,
    ToolCallRequest,
    ToolStep,
    TrajectoryEvent,
    decode,
)
from agents.trajectory_sink import CleanTexts, TrajectorySink, scrub_trajectory


def scrub(text: str) -> str:
    return text.replace("Alice", "<PERSON>")


def model_step(index: int, prompt: str, output: str | None, args: str | None = None) -> ModelStep:
    calls = [ToolCallRequest(id="c1", name="lookup", arguments=args)] if args else []
    return ModelStep(
        index=index,
        messages=[{"role": "user", "content": prompt}],
        output=output,
        tool_calls=calls,
        model="arloop",
        policy_version="v1",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        latency_ms=1.0,
    )


def trajectory(*steps) -> TrajectoryEvent:
    return TrajectoryEvent(
        event_id="traj_1",
        thread_id="th",
        agent="triage",
        user_id="u1",
        input="Alice has a cough",
        output="Rest, Alice.",
        policy_version="v1",
        steps=list(steps),
        started_at=1.0,
        finished_at=2.0,
    )


def test_scrubbing_drops_token_ids_only_where_text_changed():
    event = trajectory(
        model_step(0, "Alice has a cough", None, '{"who": "Alice"}'),
        ToolStep(
            index=1,
            call_id="c1",
            name="lookup",
            arguments={"who": ["Alice", 3]},
            output="Alice: no record",
            latency_ms=1.0,
        ),
        model_step(2, "no names here", "Rest, Alice."),
        model_step(3, "no names here", "Rest well."),
    )
    clean = scrub_trajectory(event, scrub)
    first, tool, third, fourth = clean.steps
    assert "Alice" not in clean.model_dump_json()
    assert clean.input == "<PERSON> has a cough" and clean.output == "Rest, <PERSON>."
    assert first.prompt_token_ids is None and first.completion_token_ids is None
    assert first.tool_calls[0].arguments == '{"who": "<PERSON>"}' and first.logprobs is None
    assert tool.arguments == {"who": ["<PERSON>", 3]} and tool.output == "<PERSON>: no record"
    assert third.prompt_token_ids == [1, 2] and third.completion_token_ids is None
    assert third.logprobs is None
    assert fourth == event.steps[3]  # untouched steps keep their tokens


def test_scrubbing_covers_assistant_tool_calls_inside_messages():
    step = model_step(0, "hi", "ok").model_copy(
        update={
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "Alice"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "Alice found"},
            ]
        }
    )
    clean = scrub_trajectory(trajectory(step), scrub)
    assert "Alice" not in clean.model_dump_json() and clean.steps[0].prompt_token_ids is None


async def test_sink_writes_one_scrubbed_event(aredis):
    event = trajectory(model_step(0, "Alice has a cough", "Rest."))
    entry_id = await TrajectorySink(aredis, scrub).write(event)
    [(stream_id, fields)] = await aredis.xrange(STREAM_TRAJECTORIES)
    assert stream_id.decode() == entry_id
    stored = decode(fields)
    assert stored == scrub_trajectory(event, scrub) and b"Alice" not in fields[b"data"]


async def test_the_case_a_reply_joined_is_scrubbed_like_the_input(aredis):
    """A reply to a follow-up question carries the user's earlier message in its metadata
    (`CASE_KEY`): the name in it is scrubbed as the input's would be."""
    event = trajectory(model_step(0, "Alice has a cough", "Rest."))
    event = event.model_copy(update={"metadata": {CASE_KEY: "Alice has a cough\nAge: 3"}})
    await TrajectorySink(aredis, scrub).write(event)
    [(_, fields)] = await aredis.xrange(STREAM_TRAJECTORIES)
    assert b"Alice" not in fields[b"data"]
    assert decode(fields).case == scrub("Alice has a cough\nAge: 3") != event.case


async def test_sink_without_scrubber_writes_the_event_as_is(aredis):
    event = trajectory(model_step(0, "Alice has a cough", "Rest."))
    await TrajectorySink(aredis).write(event)
    [(_, fields)] = await aredis.xrange(STREAM_TRAJECTORIES)
    assert decode(fields) == event


def test_texts_found_clean_are_not_scrubbed_again_and_phi_is_never_remembered():
    seen: list[str] = []

    def counting(text: str) -> str:
        seen.append(text)
        return scrub(text)

    cached = CleanTexts(counting, size=2)
    assert [cached(t) for t in ("system prompt", "Alice", "system prompt", "Alice")] == [
        "system prompt",
        "<PERSON>",
        "system prompt",
        "<PERSON>",
    ]
    assert seen == ["system prompt", "Alice", "Alice"]  # the clean text once, the name each time
    cached("a"), cached("b")  # the oldest clean text falls out past `size`
    cached("system prompt")
    assert seen[-1] == "system prompt"


async def test_a_capped_stream_keeps_about_its_cap(aredis, redis_client):
    """Issue 36, item 6: retention (XADD MAXLEN ~): the oldest runs go, the newest stay."""
    sink = TrajectorySink(aredis, max_entries=100)
    for n in range(400):
        await sink.write(trajectory().model_copy(update={"event_id": f"traj_{n}"}))
    kept = redis_client.xlen(STREAM_TRAJECTORIES)
    assert 100 <= kept < 250  # approximate trimming drops whole nodes of the stream
    [(_, newest)] = redis_client.xrevrange(STREAM_TRAJECTORIES, count=1)
    assert decode(newest).event_id == "traj_399"
    await TrajectorySink(aredis).write(trajectory())  # no cap: nothing trimmed
    assert redis_client.xlen(STREAM_TRAJECTORIES) == kept + 1
