"""Events as the agent API writes them (agents.events models), on the tiny model's tokens."""

from __future__ import annotations

import functools
import time

import redis

from agents.events import (
    ONE_SHARD,
    FeedbackEvent,
    FeedbackKind,
    ModelStep,
    StreamShards,
    ToolStep,
    TrajectoryEvent,
    encode,
    new_id,
)
from learner.logprobs import completion_logprobs
from learner.policy.tiny_model import build_tiny_model, build_tokenizer


@functools.cache
def tokenizer():
    return build_tokenizer()


@functools.cache
def base_model():
    """The tiny model with the weights `load_base("tiny")` gives (same seed)."""
    return build_tiny_model(seed=0)[0]


def prompt_ids(text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return tokenizer().apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def completion_ids(text: str) -> list[int]:
    return tokenizer()(text, add_special_tokens=False)["input_ids"] + [tokenizer().eos_token_id]


def model_step(
    index: int, prompt: str, answer: str, *, with_ids: bool = True, logprobs: bool = False
) -> ModelStep:
    p, c = prompt_ids(prompt), completion_ids(answer)
    lp = None
    if logprobs:
        lp = completion_logprobs(base_model(), p, c, tokenizer().pad_token_id).tolist()
    return ModelStep(
        index=index,
        messages=[{"role": "user", "content": prompt}],
        output=answer,
        model="arloop",
        policy_version="v0",
        prompt_token_ids=p if with_ids else None,
        completion_token_ids=c if with_ids else None,
        logprobs=lp,
        latency_ms=5.0,
    )


def trajectory(
    prompt: str = "What is 12 plus 30?",
    answer: str = "The answer is 42.",
    *,
    user: str = "u1",
    group: str | None = None,
    with_ids: bool = True,
    logprobs: bool = False,
    finished_at: float | None = None,
    tool_turn: bool = False,
    event_id: str | None = None,
) -> TrajectoryEvent:
    """A one-turn run, or with `tool_turn` a calculator call (step 0), its result, and an answer."""
    now = time.time() if finished_at is None else finished_at
    steps: list = [model_step(0, prompt, answer, with_ids=with_ids, logprobs=logprobs)]
    if tool_turn:
        steps = [
            model_step(0, prompt, "<tool_call>", with_ids=with_ids, logprobs=logprobs),
            ToolStep(
                index=1,
                call_id="c1",
                name="calculator",
                arguments={"expression": "12+30"},
                output="42",
                latency_ms=1.0,
            ),
            model_step(2, prompt + " 42", answer, with_ids=with_ids, logprobs=logprobs),
        ]
    return TrajectoryEvent(
        event_id=event_id or new_id("traj"),
        thread_id=new_id("thread"),
        agent="tutor",
        user_id=user,
        input=prompt,
        output=answer,
        policy_version="v0",
        steps=steps,
        started_at=now - 1,
        finished_at=now,
        metadata={"group": group} if group else {},
    )


def feedback(
    trajectory_id: str,
    kind: str = "thumbs",
    value: float | None = 1,
    *,
    user: str = "u1",
    text: str | None = None,
    turn: int | None = None,
    created_at: float | None = None,
    source: str = "user",
    credential: str | None = None,
) -> FeedbackEvent:
    return FeedbackEvent(
        event_id=new_id("fb"),
        trajectory_id=trajectory_id,
        user_id=user,
        kind=FeedbackKind(kind),
        value=value,
        text=text,
        policy_version="v0",
        turn=turn,
        source=source,
        created_at=time.time() if created_at is None else created_at,
        credential=credential,
    )


def xadd(
    client: redis.Redis,
    event: TrajectoryEvent | FeedbackEvent,
    shards: StreamShards = ONE_SHARD,
) -> str:
    """XADD the event to its stream (its run's shard) exactly as the serving side does."""
    return client.xadd(_stream(event, shards), encode(event)).decode()


def xadd_all(client: redis.Redis, events: list[TrajectoryEvent | FeedbackEvent]) -> None:
    """XADD every event in one transaction: a learner that is already reading sees all or none
    of them (one by one, a busy machine let a round start on the first pair alone)."""
    with client.pipeline(transaction=True) as pipe:
        for event in events:
            pipe.xadd(_stream(event), encode(event))
        pipe.execute()


def _stream(event: TrajectoryEvent | FeedbackEvent, shards: StreamShards = ONE_SHARD) -> str:
    shard = shards.of(event.trajectory_id)
    if isinstance(event, TrajectoryEvent):
        return shards.trajectories(shard)
    return shards.feedback(shard)
