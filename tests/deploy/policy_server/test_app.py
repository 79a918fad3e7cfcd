"""The policy server over real HTTP: the openai SDK and litellm as clients, a real Redis.

Every test runs against both engines (transformers, llama.cpp on an F16 export: `tiny_settings`);
logprobs are compared with the learner's fp32 recompute within each engine's tolerance.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import redis
import torch

from agents.errors import ArloopError
from deploy.policy_server.openai_wire import ChatRequest, OpenAIError, error_body
from learner.logprobs import completion_logprobs
from learner.policy.chat_format import prompt_token_ids
from learner.policy.models import load_base
from learner.policy.registry import PolicyRegistry
from tests.deploy.policy_server.support import (
    ENGINES,
    make_full,
    publish,
    running_server,
    tiny_settings,
    train_to_say,
)
from tests.model_cache import MODEL_CACHE

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
ASK_CALL = [{"role": "user", "content": "What is 12 plus 30?"}]
ASK_BROKEN = [{"role": "user", "content": "Say something broken."}]
CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'
BROKEN_TEXT = 'Sorry <tool_call>{"name": calculator}</tool_call>'
HI = [{"role": "user", "content": "hi"}]
LOGPROB_ATOL = {"transformers": 1e-4, "llamacpp": 5e-3}
"""Largest |served - learner's fp32| logprob: transformers computes what the learner does;
llama.cpp serves an F16 export (weights, KV and the activations of its matmuls in 16 bits)."""


@pytest.fixture(scope="module")
def tiny():
    return load_base("tiny", cache_dir=MODEL_CACHE)


@pytest.fixture(scope="module", params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory, tiny, engine):
    """One server per engine; `arloop@v1` is a tiny model taught to answer with tool calls."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    folder = tmp_path_factory.mktemp("ckpt") / "tool-model"
    _teach_tool_calls(folder)
    publish(PolicyRegistry(client), "full", folder, champion=False)
    settings = tiny_settings(
        redis_server.url, batch_window_ms=60.0, max_batch_size=8, policy_engine=engine
    )
    with running_server(settings) as base:
        yield base
    client.close()


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server, api_key="none", max_retries=0)


def _teach_tool_calls(folder):
    model, tok = load_base("tiny", cache_dir=MODEL_CACHE)
    pairs = [
        (_server_prompt(tok, ASK_CALL, [CALC]), CALL_TEXT),
        (_server_prompt(tok, ASK_BROKEN, [CALC]), BROKEN_TEXT),
    ]
    model, _ = train_to_say(model, tok, pairs)
    make_full(folder, seed=0, scale=0.0, model=model)


def _server_prompt(tok, messages, tools=None):
    req = ChatRequest(model="arloop", messages=messages, tools=tools)
    return prompt_token_ids(tok, req.plain_messages(), req.plain_tools())


def test_openai_sdk_plain_completion_with_token_ids(oai, tiny):
    r = oai.chat.completions.create(
        model="arloop",
        messages=HI,
        max_tokens=6,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    assert r.system_fingerprint == "v0" and r.object == "chat.completion"
    body = r.model_dump()
    assert body["engine"] in ("transformers-fp32", "llamacpp-f16")
    choice = body["choices"][0]
    assert body["prompt_token_ids"] == _server_prompt(tiny[1], HI)
    assert len(choice["token_ids"]) == r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == len(body["prompt_token_ids"])
    assert choice["message"]["content"] == tiny[1].decode(
        choice["token_ids"], skip_special_tokens=True
    )


def test_logprobs_equal_the_learners_recompute_under_concurrency(oai, server, tiny, engine):
    model, tok = tiny
    prompts = [
        "hi",
        "What is 12 plus 30? Use the calculator tool.",
        "A patient reports a headache",
        "Think step by step, then write #### and the answer.",
        "yes",
        "no thanks",
    ]

    def ask(i_text):
        i, text = i_text
        return oai.chat.completions.create(
            model="arloop",
            messages=[{"role": "user", "content": text}],
            max_tokens=4 + 3 * i,
            temperature=[0, 0.7, 1.0, 1.5][i % 4],
            seed=i,
            logprobs=True,
            top_logprobs=2,
            extra_body={"return_token_ids": True},
        ).model_dump()

    before = _shared_passes(server)
    with ThreadPoolExecutor(len(prompts)) as pool:
        bodies = list(pool.map(ask, enumerate(prompts)))
    assert _shared_passes(server) > before  # some forward passes served several requests
    for body in bodies:
        choice = body["choices"][0]
        served = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
        ref = completion_logprobs(
            model, body["prompt_token_ids"], choice["token_ids"], tok.pad_token_id
        )
        torch.testing.assert_close(served, ref, atol=LOGPROB_ATOL[engine], rtol=0)
        for entry in choice["logprobs"]["content"]:
            assert len(entry["top_logprobs"]) == 2
            assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6


def test_streaming_gives_the_same_completion_as_a_plain_request(oai):
    args = {"model": "arloop", "messages": HI, "max_tokens": 8, "temperature": 0}
    plain = oai.chat.completions.create(**args, logprobs=True)
    chunks = list(
        oai.chat.completions.create(
            **args, logprobs=True, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    lps = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert text == plain.choices[0].message.content
    assert lps == pytest.approx([e.logprob for e in plain.choices[0].logprobs.content], abs=1e-4)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and {c.system_fingerprint for c in chunks} == {
        "v0"
    }


def test_n_samples_of_one_prompt_are_seeded(oai):
    args = {
        "model": "arloop",
        "messages": HI,
        "max_tokens": 6,
        "n": 3,
        "seed": 11,
        "temperature": 1.0,
    }
    first = oai.chat.completions.create(**args)
    again = oai.chat.completions.create(**args)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1  # different samples, not one sample three times
    assert first.usage.completion_tokens == 18


def test_n_samples_share_the_prompt_and_keep_the_models_logprobs(oai, tiny, engine, monkeypatch):
    # llama.cpp: the first choice prefills the prompt, the others copy its KV (runner.claim)
    model, tok = tiny
    copies = []
    if engine == "llamacpp":
        import llama_cpp

        copy = llama_cpp.llama_memory_seq_cp
        monkeypatch.setattr(
            llama_cpp, "llama_memory_seq_cp", lambda *a: copies.append(a) or copy(*a)
        )
    text = "A new question for the copy test: what is 17 plus 25? Use the calculator tool."
    body = oai.chat.completions.create(
        model="arloop",
        messages=[{"role": "user", "content": text}],
        max_tokens=6,
        n=4,
        seed=3,
        temperature=1.0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    ).model_dump()
    assert len(body["prompt_token_ids"]) > 16  # longer than the copy threshold: copies happen
    for choice in body["choices"]:
        served = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
        ref = completion_logprobs(
            model, body["prompt_token_ids"], choice["token_ids"], tok.pad_token_id
        )
        torch.testing.assert_close(served, ref, atol=LOGPROB_ATOL[engine], rtol=0)
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) > 1  # four samples, not one
    if engine == "llamacpp":
        assert len(copies) == 3  # the three later choices copied the first one's prompt


def test_stop_strings_end_the_completion(oai):
    free = oai.chat.completions.create(model="arloop", messages=HI, max_tokens=10, temperature=0)
    text = free.choices[0].message.content
    stop = text[4:6]
    cut = oai.chat.completions.create(
        model="arloop", messages=HI, max_tokens=10, temperature=0, stop=[stop, "never-seen"]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.find(stop)]


def test_include_stop_str_in_output_keeps_the_stop_string(oai):
    """vLLM's extension: the text ends with the stop string instead of before it."""
    free = oai.chat.completions.create(model="arloop", messages=HI, max_tokens=10, temperature=0)
    text = free.choices[0].message.content
    stop = text[4:6]
    kept = oai.chat.completions.create(
        model="arloop",
        messages=HI,
        max_tokens=10,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].message.content == text[: text.find(stop) + len(stop)]


def test_penalties_change_greedy_choices_and_leave_logprobs_the_models(oai, tiny, engine):
    """A greedy completion that repeats a token changes under a presence penalty; the logged
    logprobs stay the model's own (the learner recomputes them without penalties)."""
    ask = {"model": "arloop", "messages": HI, "max_tokens": 24, "temperature": 0}
    plain = oai.chat.completions.create(**ask, extra_body={"return_token_ids": True})
    ids = plain.model_dump()["choices"][0]["token_ids"]
    assert len(set(ids)) < len(ids), f"precondition: the greedy text repeats a token ({ids})"
    penalised = oai.chat.completions.create(
        **ask,
        presence_penalty=2.0,
        frequency_penalty=2.0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    body = penalised.model_dump()
    new_ids = body["choices"][0]["token_ids"]
    assert new_ids != ids
    model, tok = tiny
    own = completion_logprobs(model, body["prompt_token_ids"], new_ids, tok.pad_token_id)
    served = torch.tensor([e["logprob"] for e in body["choices"][0]["logprobs"]["content"]])
    torch.testing.assert_close(served, own, atol=LOGPROB_ATOL[engine], rtol=0)


def test_tool_calls_are_parsed_into_openai_tool_calls(oai):
    r = oai.chat.completions.create(
        model="arloop@v1", messages=ASK_CALL, tools=[CALC], temperature=0, max_tokens=60
    )
    choice = r.choices[0]
    assert r.system_fingerprint == "v1"
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "12+30"}


def test_streamed_tool_calls_arrive_as_tool_call_deltas(oai):
    chunks = list(
        oai.chat.completions.create(
            model="arloop@v1",
            messages=ASK_CALL,
            tools=[CALC],
            temperature=0,
            max_tokens=60,
            stream=True,
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert content == ""  # the call text never leaks as content
    # OpenAI's shape: id, type and name first with empty arguments, then argument pieces
    head, pieces = calls[0], calls[1:]
    assert head.id and head.type == "function" and head.function.name == "calculator"
    assert head.function.arguments == "" and len(pieces) >= 2  # 24 characters, 16 a piece
    assert all(p.index == 0 and p.id is None and p.function.name is None for p in pieces)
    arguments = "".join(p.function.arguments for p in pieces)
    assert json.loads(arguments) == {"expression": "12+30"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_malformed_tool_call_stays_plain_content(oai):
    for stream in (False, True):
        args = {
            "model": "arloop@v1",
            "messages": ASK_BROKEN,
            "tools": [CALC],
            "temperature": 0,
            "max_tokens": 60,
        }
        if stream:
            chunks = list(oai.chat.completions.create(**args, stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = oai.chat.completions.create(**args)
            content, reason = r.choices[0].message.content, r.choices[0].finish_reason
            assert r.choices[0].message.tool_calls is None
        assert content == BROKEN_TEXT and reason == "stop"


def test_without_tools_the_call_text_is_just_text(oai):
    r = oai.chat.completions.create(
        model="arloop@v1",
        messages=ASK_CALL,
        tools=[CALC],
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


def test_litellm_talks_to_the_server(server, tiny, engine):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    common = {
        "model": "openai/arloop",
        "api_base": server,
        "api_key": "none",
        "messages": HI,
        "max_tokens": 5,
        "temperature": 0,
    }
    r = litellm.completion(
        **common, logprobs=True, top_logprobs=1, extra_body={"return_token_ids": True}
    )
    assert r.system_fingerprint == "v0"
    assert r.prompt_token_ids == _server_prompt(tiny[1], HI)
    ids = r.choices[0].token_ids
    ref = completion_logprobs(tiny[0], r.prompt_token_ids, ids, tiny[1].pad_token_id)
    served = torch.tensor([e.logprob for e in r.choices[0].logprobs.content])
    torch.testing.assert_close(served, ref, atol=LOGPROB_ATOL[engine], rtol=0)
    assert r.engine == {"transformers": "transformers-fp32", "llamacpp": "llamacpp-f16"}[engine]
    chunks = list(litellm.completion(**common, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == r.choices[0].message.content
    tools = litellm.completion(
        **{**common, "model": "openai/arloop@v1", "messages": ASK_CALL, "max_tokens": 60},
        tools=[CALC],
    )
    assert tools.choices[0].message.tool_calls[0].function.name == "calculator"
    assert tools.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "patch, status, param",
    [
        ({"model": "gpt-4"}, 404, "model"),
        ({"model": "arloop@v99"}, 404, "model"),
        ({"model": "arloop@candidate"}, 404, "model"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages.0.content.0.type",
        ),
        ({"messages": [{"content": "x"}]}, 400, "messages.0.role"),
        ({"temperature": 3}, 400, "temperature"),
        ({"top_p": 0}, 400, "top_p"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"n": 0}, 400, "n"),
        ({"n": 17}, 400, "n"),
        ({"top_logprobs": 3}, 400, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"frequency_penalty": 2.5}, 400, "frequency_penalty"),
        ({"presence_penalty": -3}, 400, "presence_penalty"),
        ({"tools": [{"type": "retrieval"}]}, 400, "tools.0.type"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"messages": [{"role": "user", "content": "hi " * 600}]}, 400, "messages"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(server, patch, status, param):
    body = {"model": "arloop", "messages": HI, "max_tokens": 2, **patch}
    r = httpx.post(f"{server}/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"


def test_context_overflow_names_the_limit(server):
    body = {"model": "arloop", "messages": [{"role": "user", "content": "hi " * 600}]}
    err = httpx.post(f"{server}/chat/completions", json=body, timeout=30).json()["error"]
    assert err["code"] == "context_length_exceeded" and "512" in err["message"]


def test_body_that_is_not_json_is_a_400(server):
    r = httpx.post(
        f"{server}/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_any_arloop_error_has_openai_shape():
    assert error_body(ArloopError(503, "registry down", retry_after=2)) == {
        "error": {"message": "registry down", "type": "server_error", "param": None, "code": None}
    }
    named = error_body(OpenAIError(404, "no v9", param="model", code="model_not_found"))["error"]
    assert (named["type"], named["param"], named["code"]) == (
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def test_sdk_raises_the_matching_errors(oai):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="arloop@v42", messages=HI)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="arloop", messages=HI, temperature=-1)


def test_max_tokens_above_the_cap_is_clamped(oai):
    r = oai.chat.completions.create(model="arloop", messages=HI, max_tokens=100_000, temperature=0)
    assert r.usage.completion_tokens <= 64  # max_tokens_cap of these settings
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 64


def test_models_health_and_metrics(server, oai):
    ids = [m.id for m in oai.models.list()]
    assert {"arloop", "arloop@champion", "arloop@v0", "arloop@v1"} <= set(ids)
    root = server.removesuffix("/v1")
    assert httpx.get(f"{root}/healthz").json()["serving"] == {"champion": "v0"}
    oai.chat.completions.create(model="arloop", messages=HI, max_tokens=3)
    text = httpx.get(f"{root}/metrics").text
    assert 'arloop_policy_requests_total{code="200"}' in text
    assert 'arloop_policy_requests_total{code="404"}' in text
    assert 'arloop_policy_serving{alias="champion",version="v0"} 1.0' in text
    assert _metric(text, 'arloop_policy_generated_tokens_total{version="v0"}') >= 3


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


def _shared_passes(server: str) -> float:
    """Forward passes so far that carried more than one row."""
    text = httpx.get(server.removesuffix("/v1") + "/metrics").text
    total = _metric(text, "arloop_policy_batch_rows_count")
    return total - _metric(text, 'arloop_policy_batch_rows_bucket{le="1.0"}')


async def test_the_agents_policy_client_records_the_engine_with_the_tokens(server, tiny, engine):
    from agents.policy_client import PolicyClient, PolicyConfig

    config = PolicyConfig(model="openai/arloop", api_base=server, api_key="none", retries=0)
    step = await PolicyClient(config).complete(HI, arm="champion")
    assert step.engine == {"transformers": "transformers-fp32", "llamacpp": "llamacpp-f16"}[engine]
    assert step.prompt_token_ids == _server_prompt(tiny[1], HI)
    assert len(step.logprobs) == len(step.completion_token_ids) > 0
