"""Resampling in the learner: the policy server's sampler in-process, replays through real tools."""

from __future__ import annotations

import httpx
import pytest
import redis

from agents.events import ModelStep
from learner.labels import Grounding
from learner.policy.chat_format import HERMES, prompt_token_ids
from learner.policy.generation import SamplingParams, generate
from learner.policy.models import load_base
from learner.policy.registry import PolicyRegistry
from learner.resample import Start, faithful, replay
from tests.deploy.policy_server.support import running_server, tiny_settings, train_to_say
from tests.model_cache import MODEL_CACHE
from tools.calculator import Calculator
from tools.verifiers import final_number

CALC = Calculator()
ASK = [{"role": "user", "content": "What is 12 plus 30?"}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'


def test_in_process_generation_matches_the_policy_server_for_a_seed(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    PolicyRegistry(client).ensure_base("tiny")
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    body = {
        "model": "arloop",
        "messages": ASK,
        "n": 3,
        "seed": 7,
        "temperature": 1.0,
        "max_tokens": 10,
        "logprobs": True,
        "return_token_ids": True,
    }
    with running_server(tiny_settings(redis_server.url)) as base:
        served = httpx.post(f"{base}/chat/completions", json=body, timeout=60).json()
    prompt = prompt_token_ids(tok, ASK)
    assert served["prompt_token_ids"] == prompt
    [mine] = generate(
        model, tok, [prompt], [SamplingParams(temperature=1.0, max_tokens=10, seed=7)], n=3
    )
    assert len({tuple(m.token_ids) for m in mine}) > 1  # three samples, not one thrice
    for choice, ours in zip(served["choices"], mine, strict=True):
        assert choice["token_ids"] == ours.token_ids
        logged = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert logged == pytest.approx(ours.logprobs, abs=1e-4)
    client.close()


def _step(tok, messages, tools) -> ModelStep:
    return ModelStep(
        index=0,
        messages=messages,
        tool_names=[t.name for t in tools],
        output="",
        model="arloop",
        policy_version="v0",
        prompt_token_ids=prompt_token_ids(tok, messages, [t.spec() for t in tools], HERMES),
        completion_token_ids=[1],
        latency_ms=1.0,
    )


def _tool_thread(messages, call_id: str) -> list[dict]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "12+30"}'},
    }
    return messages + [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "42"},
    ]


def test_a_replay_runs_the_agents_real_tool_and_checks_the_answer_against_the_label():
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    specs = [CALC.spec()]
    first = prompt_token_ids(tok, ASK, specs, HERMES)
    after = prompt_token_ids(tok, _tool_thread(ASK, "call_0_0_0"), specs, HERMES)
    # greedy: call the calculator, then read its output back (42 only comes from the tool)
    train_to_say(model, tok, [(first, CALL), (after, "It is 42. #### 42")], steps=300)
    grounding = Grounding(final_number, final_number, (CALC,), max_steps=3, tool_format=HERMES)
    start = Start(_step(tok, ASK, [CALC]), grounding, "42", key="k")
    assert faithful(start, tok)
    [[run]] = replay(model, tok, [start], n=1, temperature=0.0, max_tokens=40, seed=0)
    assert run.used_tool and run.solved and run.output.endswith("#### 42")
    assert [t.after_tool for t in run.turns] == [False, True]
    assert run.turns[0].prompt_ids == first and run.turns[1].prompt_ids == after
    wrong = Start(start.step, grounding, "41", key="k")
    [[run]] = replay(model, tok, [wrong], n=1, temperature=0.0, max_tokens=40, seed=0)
    assert run.used_tool and not run.solved


def test_a_replay_stops_at_the_step_budget_unsolved():
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    specs = [CALC.spec()]
    first = prompt_token_ids(tok, ASK, specs, HERMES)
    after = prompt_token_ids(tok, _tool_thread(ASK, "call_0_0_0"), specs, HERMES)
    train_to_say(model, tok, [(first, CALL), (after, CALL)], steps=300)  # calls forever
    grounding = Grounding(final_number, final_number, (CALC,), max_steps=2, tool_format=HERMES)
    start = Start(_step(tok, ASK, [CALC]), grounding, "42", key="k")
    [[run]] = replay(model, tok, [start], n=1, temperature=0.0, max_tokens=40, seed=0)
    assert len(run.turns) == 2 and run.output is None and not run.solved


def test_a_prompt_whose_messages_no_longer_render_to_its_tokens_is_not_replayed():
    _, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    step = _step(tok, ASK, [CALC])
    scrubbed = step.model_copy(update={"messages": [{"role": "user", "content": "[NAME] asks"}]})
    grounding = Grounding(final_number, final_number, (CALC,), tool_format=HERMES)
    assert faithful(Start(step, grounding, "42", "k"), tok)
    assert not faithful(Start(scrubbed, grounding, "42", "k"), tok)
    other_format = Grounding(final_number, final_number, (CALC,), tool_format="line")
    assert not faithful(Start(step, other_format, "42", "k"), tok)
