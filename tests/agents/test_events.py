import pytest
from pydantic import ValidationError

from agents.events import (
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    EventDecodeError,
    FeedbackEvent,
    FeedbackKind,
    ModelStep,
    ToolCallRequest,
    ToolStep,
    TrajectoryEvent,
    decode,
    encode,
)


def _trajectory() -> TrajectoryEvent:
    return TrajectoryEvent(
        event_id="traj_1",
        thread_id="th_1",
        agent="tutor",
        user_id="u1",
        input="What is 2+3?",
        output="5",
        policy_version="v0",
        started_at=1.0,
        finished_at=2.0,
        steps=[
            ModelStep(
                index=0,
                messages=[{"role": "user", "content": "What is 2+3?"}],
                tool_names=["calculator"],
                output=None,
                tool_calls=[
                    ToolCallRequest(id="c1", name="calculator", arguments='{"expression": "2+3"}')
                ],
                model="arloop",
                policy_version="v0",
                prompt_token_ids=[1, 2],
                completion_token_ids=[3, 4],
                logprobs=[-0.1, -0.2],
                latency_ms=3.0,
            ),
            ToolStep(
                index=1,
                call_id="c1",
                name="calculator",
                arguments={"expression": "2+3"},
                output="5",
                latency_ms=0.1,
            ),
        ],
    )


def test_trajectory_round_trips_through_redis(redis_client):
    event = _trajectory()
    redis_client.xadd(STREAM_TRAJECTORIES, encode(event))
    [(_, fields)] = redis_client.xrange(STREAM_TRAJECTORIES)
    back = decode(fields)
    assert back == event
    assert back.trajectory_id == "traj_1"
    assert [type(s) for s in back.steps] == [ModelStep, ToolStep]


def test_feedback_round_trips_and_is_frozen(redis_client):
    event = FeedbackEvent(
        event_id="fb_1",
        trajectory_id="traj_1",
        user_id="u1",
        kind=FeedbackKind.RATING,
        value=4,
        policy_version="v0",
    )
    redis_client.xadd(STREAM_FEEDBACK, encode(event))
    [(_, fields)] = redis_client.xrange(STREAM_FEEDBACK)
    assert decode(fields) == event
    with pytest.raises(ValidationError):
        event.value = 5  # frozen


@pytest.mark.parametrize(
    "kind,value,text",
    [("thumbs", 0, None), ("rating", 6, None), ("outcome", 1.5, None), ("correction", None, " ")],
)
def test_feedback_value_must_fit_its_kind(kind, value, text):
    with pytest.raises(ValueError):
        FeedbackEvent(
            event_id="x",
            trajectory_id="t",
            user_id="u",
            kind=kind,
            value=value,
            text=text,
            policy_version="v0",
        )


def test_extra_fields_are_refused():
    with pytest.raises(ValueError):
        FeedbackEvent(
            event_id="x",
            trajectory_id="t",
            user_id="u",
            kind="thumbs",
            value=1,
            policy_version="v0",
            surprise=True,
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "Nope", "schema_version": "1", "data": "{}"},
        {"type": "FeedbackEvent", "schema_version": "9", "data": "{}"},
        {"type": "FeedbackEvent", "schema_version": "1", "data": "not json"},
        {"type": "FeedbackEvent", "schema_version": "1", "data": '{"event_id": "x"}'},
    ],
)
def test_bad_entries_raise_decode_error(fields):
    with pytest.raises(EventDecodeError):
        decode(fields)
