"""OpenAI compatibility without silent gaps, through the `openai` client, against both engines.

The served model is the tiny base with random weights: it writes nonsense, so a reply that
parses as the schema or calls the named tool does so because the constraint made it.
"""

import json

import openai
import pytest
import redis
import torch

from tests.deploy.policy_server.support import ENGINES, running_server, tiny_settings

WEATHER = {  # short: the tiny model's context is 512 characters' worth of tokens
    "type": "function",
    "function": {
        "name": "sky",
        "parameters": {"type": "object", "properties": {"c": {"enum": ["P", "O"]}}},
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"x": {"enum": ["1", "2"]}}},
    },
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
HI = [{"role": "user", "content": "Rain?"}]


@pytest.fixture(scope="module", params=ENGINES)
def base(request, redis_server):
    redis.Redis.from_url(redis_server.url).flushall()
    settings = tiny_settings(
        redis_server.url,
        policy_engine=request.param,
        clamp_max_tokens=False,
        max_tokens_cap=300,
        max_request_tokens=400,
    )
    with running_server(settings) as url:
        yield url


@pytest.fixture
def oai(base):
    return openai.OpenAI(base_url=base, api_key="none", max_retries=0)


@pytest.fixture(scope="module", params=ENGINES)
def line_oai(request, redis_server):
    """A server in the line tool format (`CALL name: argument`), whose prompt has room for two
    tools in the tiny model's context."""
    settings = tiny_settings(redis_server.url, policy_engine=request.param, tool_format="line")
    with running_server(settings) as url:
        yield openai.OpenAI(base_url=url, api_key="none", max_retries=0)


def _ask(oai, **kwargs):
    return oai.chat.completions.create(model="arloop", messages=HI, **kwargs)


def test_json_schema_replies_match_the_schema(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    r = _ask(oai, response_format=fmt, n=4, seed=3, max_tokens=40)
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.message.content
        reply = json.loads(choice.message.content)
        assert reply["answer"] in ("yes", "no") and isinstance(reply["sure"], bool)
        assert set(reply) == {"answer", "sure"}


def test_without_a_format_the_random_model_writes_no_json(oai):
    """The precondition that makes the test above mean something."""
    r = _ask(oai, n=4, seed=3, max_tokens=40)
    for choice in r.choices:
        with pytest.raises(ValueError):
            json.loads(choice.message.content or "")


def test_json_object_replies_are_objects(oai):
    r = _ask(oai, response_format={"type": "json_object"}, n=2, seed=5, max_tokens=200)
    for choice in r.choices:
        text = choice.message.content
        assert text.lstrip().startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


def test_streamed_json_schema_is_the_same_reply(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    whole = _ask(oai, response_format=fmt, seed=9, temperature=0, max_tokens=40)
    chunks = list(_ask(oai, response_format=fmt, seed=9, temperature=0, max_tokens=40, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert json.loads(text)["answer"] in ("yes", "no")


def test_a_named_function_is_called(line_oai):
    choice = {"type": "function", "function": {"name": "sky"}}
    r = _ask(line_oai, tools=[CALC, WEATHER], tool_choice=choice, n=3, seed=1, max_tokens=80)
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c.message.content
        call = c.message.tool_calls[0]
        assert call.function.name == "sky"
        assert set(json.loads(call.function.arguments)) == {"c"}


def test_without_tool_choice_the_random_model_calls_nothing(line_oai):
    """The precondition that makes the forced calls mean something."""
    r = _ask(line_oai, tools=[CALC, WEATHER], n=3, seed=1, max_tokens=40)
    assert all(not c.message.tool_calls for c in r.choices)


def test_required_calls_one_of_the_tools(line_oai):
    r = _ask(
        line_oai,
        tools=[CALC, WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        n=3,
        seed=2,
        max_tokens=80,
    )
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
        assert c.message.tool_calls[0].function.name in ("sky", "add")


def test_streamed_forced_call_arrives_in_openai_deltas(line_oai):
    choice = {"type": "function", "function": {"name": "add"}}
    chunks = list(
        _ask(line_oai, tools=[CALC], tool_choice=choice, seed=4, max_tokens=80, stream=True)
    )
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "add" and deltas[0].id
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert set(json.loads(arguments)) == {"x"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logit_bias_steers_every_token(oai):
    r = _ask(
        oai, logit_bias={"40": 100}, max_tokens=6, seed=1, extra_body={"return_token_ids": True}
    )
    assert r.choices[0].model_extra["token_ids"] == [40] * 6


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        (
            {"tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {"type": "bogus"}},
                }
            },
            "response_format",
        ),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"seed": 2**70}, "seed"),
        ({"max_tokens": 301}, "max_tokens"),  # over the cap
        ({"max_tokens": 280, "n": 2}, "n"),  # 560 tokens over the request's 400
        ({"metadata": {"a": "b"}}, "metadata"),
        ({"extra_body": {"best_of": 2}}, "best_of"),
        ({"extra_body": {"functions": [CALC["function"]]}}, "functions"),
        (
            {"stream_options": {"include_obfuscation": True}, "stream": True},
            "stream_options.include_obfuscation",
        ),
    ],
)
def test_what_is_not_done_is_a_400_naming_it(oai, kwargs, param):
    kwargs = {"max_tokens": 8} | kwargs  # a copy: the parameters are shared by both engines
    with pytest.raises(openai.BadRequestError) as info:
        _ask(oai, **kwargs)
    assert info.value.body["param"] == param, info.value.body
    assert param.split(".")[0] in info.value.body["message"]


def test_max_tokens_past_the_context_is_a_400_like_openai(oai):
    long = [{"role": "user", "content": "word " * 230}]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model="arloop", messages=long, max_tokens=290)
    assert info.value.body["code"] == "context_length_exceeded"
    assert "512" in info.value.body["message"]


def test_a_seed_at_the_top_of_its_range_samples(oai):
    r = _ask(oai, seed=2**63 - 1, n=2, max_tokens=4)
    assert len(r.choices) == 2


def test_models_retrieve(oai):
    assert oai.models.retrieve("arloop").id == "arloop"
    assert oai.models.retrieve("arloop@v0").owned_by == "arloop"
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("arloop@v99")


@pytest.mark.parametrize("parallel", [False, True])
def test_the_hermes_call_grammar_gives_calls_that_parse(parallel):
    """Hermes calls do not fit the tiny model's context with their tool list, so the grammar
    is walked here with random choices among the tokens it allows (a model writing nonsense)."""
    from deploy.policy_server.constraints import constraint_factory
    from deploy.policy_server.openai_wire import ChatRequest
    from learner.policy.chat_format import parse_tool_calls
    from learner.policy.models import load_base
    from tests.model_cache import MODEL_CACHE

    _, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)

    def strict(key: str) -> dict:
        return {
            "type": "object",
            "properties": {key: {"enum": ["P", "O"]}},
            "required": [key],
            "additionalProperties": False,
        }

    tools = [
        {"type": "function", "function": {"name": "sky", "parameters": strict("c")}},
        {"type": "function", "function": {"name": "add", "parameters": strict("x")}},
    ]
    req = ChatRequest(
        model="arloop",
        messages=HI,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=parallel,
    )
    make = constraint_factory(req, tokenizer, "hermes")
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        constraint, ids = make(), []
        for _ in range(400):
            allowed = constraint.allowed(len(tokenizer)).nonzero().flatten()
            token = int(allowed[torch.randint(len(allowed), (1,), generator=gen)])
            if token == tokenizer.eos_token_id:
                break
            ids.append(token)
            if constraint.advance(token):
                break
        text = tokenizer.decode(ids)
        content, calls = parse_tool_calls(text, req.plain_tools(), "hermes")
        assert calls and content is None, text
        assert parallel or len(calls) == 1
        for call in calls:
            args = json.loads(call["function"]["arguments"])
            assert call["function"]["name"] in ("sky", "add"), text
            assert list(args.values()) in (["P"], ["O"])


def test_forced_hermes_calls_stream_their_arguments_as_they_come():
    """Each piece of the model's text as its own token event; the deltas follow the text."""
    from deploy.policy_server.openai_wire import ChatRequest
    from deploy.policy_server.stream import ChoiceStream
    from learner.policy.generation.rows import FinishEvent, TokenEvent

    req = ChatRequest(
        model="arloop", messages=HI, tools=[WEATHER, CALC], tool_choice="required", stream=True
    )
    text = (
        '<tool_call>{"name": "sky", "arguments": {"c": "P", "note": "a}b"}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"x": "1"}}</tool_call>'
    )
    stream = ChoiceStream(req, 0, tokenizer=None, tool_format="hermes")
    seen, before_end = [], 0
    for i in range(0, len(text), 3):
        deltas = stream.on_token(TokenEvent(0, 1, 0.0, None, text[i : i + 3]))
        seen += [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
        before_end = len(seen)
    done = stream.on_finish(FinishEvent(0, "stop", text, [], [], []))
    seen += [d["delta"]["tool_calls"][0] for d in done if d["delta"].get("tool_calls")]
    assert before_end >= 6  # two heads and argument pieces, before the reply ended
    heads = [d for d in seen if "id" in d]
    assert [h["function"]["name"] for h in heads] == ["sky", "add"]
    for k, expected in enumerate([{"c": "P", "note": "a}b"}, {"x": "1"}]):
        args = "".join(d["function"]["arguments"] for d in seen if d["index"] == k)
        assert json.loads(args) == expected
    assert done[-1]["finish_reason"] == "tool_calls"
    assert all(not d["delta"].get("content") for d in done)
