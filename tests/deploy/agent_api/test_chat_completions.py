"""OpenAI's `/v1/chat/completions` on the agent API, called with the plain `openai` SDK over real
HTTP: a team's own agent's calls become one trajectory per `X-Arloop-Run`, with token ids, the
learner's schema, feedback by the returned token, and a clear 4xx for every bad request."""

from __future__ import annotations

import runpy
import time
from pathlib import Path

import httpx
import openai
import pytest

from agents.events import (
    POLICY_ALIASES,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    RunStatus,
    TrajectoryEvent,
    decode,
)
from deploy.credentials import plain_key
from tests.deploy.policy_server.support import running_server, tiny_settings
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

OTHER_KEY = "other-key-" + "y" * 24
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
    },
}


def sdk(api, run: str | None = None, key: str = API_KEY, **headers) -> openai.OpenAI:
    """The plain OpenAI SDK pointed at the agent API (retries off: each error is seen once)."""
    extra = {"X-Arloop-Run": run} if run else {}
    return openai.OpenAI(
        base_url=f"{api.server.url}/v1",
        api_key=key,
        max_retries=0,
        timeout=30,
        default_headers=extra | headers,
    )


def ask(client: openai.OpenAI, text: str = "What is 2+3?", **params):
    """One call, raw: (headers, the parsed completion)."""
    raw = client.chat.completions.with_raw_response.create(
        model=params.pop("model", "arloop"),
        messages=params.pop("messages", [{"role": "user", "content": text}]),
        **params,
    )
    return raw.headers, raw.parse()


def trajectories(redis_client) -> list[TrajectoryEvent]:
    return [decode(fields) for _, fields in redis_client.xrange(STREAM_TRAJECTORIES)]


def wait_for_trajectory(redis_client, timeout_s: float = 10.0) -> TrajectoryEvent:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := trajectories(redis_client):
            return found[-1]
        time.sleep(0.05)
    raise AssertionError("no trajectory was written")


def end(api, trajectory_id: str, output: str, key: str = API_KEY) -> httpx.Response:
    return api.http.post(
        f"/v1/runs/{trajectory_id}/end",
        json={"output": output},
        headers={"Authorization": f"Bearer {key}"},
    )


def test_three_calls_of_a_run_are_one_trajectory_and_feedback_follows(start_api, llm, redis_client):
    llm.fingerprints = {"arloop@champion": "v4"}
    llm.push(
        Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]),
        Reply(content="It is 5."),
        Reply(content="Yes, 5."),
    )
    api = start_api()
    client = sdk(api, run="job-1", **{"X-Arloop-Agent": "team-bot"})
    first_headers, first = ask(client, tools=[ADD])
    call = first.choices[0].message.tool_calls[0]
    assert (call.function.name, first.choices[0].finish_reason) == ("add", "tool_calls")
    history = [
        {"role": "user", "content": "What is 2+3?"},
        first.choices[0].message.model_dump(exclude_none=True),  # echoed back, as agents do
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second_headers, second = ask(client, messages=history, tools=[ADD])
    third_headers, third = ask(client, messages=[*history, {"role": "user", "content": "Sure?"}])
    assert (second.choices[0].message.content, third.choices[0].message.content) == (
        "It is 5.",
        "Yes, 5.",
    )
    trajectory_ids = {
        h["X-Arloop-Trajectory"] for h in (first_headers, second_headers, third_headers)
    }
    assert len(trajectory_ids) == 1 and third_headers["X-Arloop-Policy-Version"] == "v4"
    # the body stays pure OpenAI: no token ids, and no logprobs the client did not ask for
    assert "token_ids" not in third.choices[0].model_dump() and third.choices[0].logprobs is None
    assert "prompt_token_ids" not in third.model_dump() and third.system_fingerprint == "v4"
    assert all(r["logprobs"] is True and r["return_token_ids"] is True for r in llm.requests)
    assert trajectories(redis_client) == []  # the run is open: nothing for the learner yet

    [trajectory_id] = trajectory_ids
    ended = end(api, trajectory_id, "It is 5.")
    assert ended.status_code == 200, ended.text
    assert ended.json()["steps"] == 3 and ended.json()["status"] == "ok"
    [event] = trajectories(redis_client)
    assert (event.trajectory_id, event.agent, event.output, event.policy_version) == (
        trajectory_id,
        "team-bot",
        "It is 5.",
        "v4",
    )
    assert event.input == "What is 2+3?" and event.user_id == api.stored(plain_key(API_KEY)["name"])
    steps = event.model_steps
    assert [s.index for s in steps] == [0, 1, 2]
    assert [s.messages for s in steps] == [r["messages"] for r in llm.requests]
    assert [s.completion_token_ids for s in steps] == [
        r["choices"][0]["token_ids"] for r in llm.responses
    ]
    assert [s.prompt_token_ids for s in steps] == [r["prompt_token_ids"] for r in llm.responses]
    assert all(len(s.logprobs) == len(s.completion_token_ids) for s in steps)
    assert steps[0].tool_names == ["add"] and steps[0].tool_calls[0].name == "add"
    assert event.metadata["arloop.credential"] == plain_key(API_KEY)["name"]

    token = third_headers["X-Arloop-Feedback-Token"]
    up = api.feedback(trajectory_id=trajectory_id, feedback_token=token, kind="thumbs", value=1)
    assert up.status_code == 202, up.text


def test_a_call_without_a_run_is_a_run_of_its_own(start_api, llm):
    llm.push(Reply(content="one"), Reply(content="two"))
    client = sdk(start_api())
    first, _ = ask(client)
    second, _ = ask(client)
    assert first["X-Arloop-Trajectory"] != second["X-Arloop-Trajectory"]


def test_logprobs_only_when_asked(start_api, llm):
    llm.push(Reply(content="five it is"))
    _, answer = ask(sdk(start_api()), logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert [t.logprob for t in content] == [
        t["logprob"] for t in llm.responses[0]["choices"][0]["logprobs"]["content"]
    ]
    assert llm.requests[0]["top_logprobs"] == 2


def test_sampling_fields_pass_through_and_the_user_stays_here(start_api, llm):
    llm.push(Reply(content="ok"))
    ask(
        sdk(start_api()),
        n=2,
        temperature=0.3,
        max_tokens=7,
        stop=["\n\n"],
        seed=11,
        tools=[ADD],
        tool_choice="auto",
        user="ann",
    )
    sent = llm.requests[0]
    assert (sent["n"], sent["temperature"], sent["max_tokens"], sent["seed"]) == (2, 0.3, 7, 11)
    assert sent["stop"] == ["\n\n"] and sent["tools"][0]["function"]["name"] == "add"
    assert sent["tool_choice"] == "auto" and "user" not in sent


def test_streamed_answer_carries_the_headers_and_its_step(start_api, llm, redis_client):
    llm.fingerprints = {"arloop@champion": "v2"}
    llm.push(Reply(content="The sum is 5"))
    api = start_api()
    client = sdk(api, run="stream-1")
    with client.chat.completions.with_streaming_response.create(
        model="arloop", messages=[{"role": "user", "content": "2+3?"}], stream=True
    ) as response:
        headers = response.headers
        assert headers["X-Arloop-Policy-Version"] == "v2"
        assert headers["X-Arloop-Feedback-Token"] and headers["X-Arloop-Trajectory"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The sum is 5"
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    assert end(api, headers["X-Arloop-Trajectory"], text).status_code == 200
    [event] = trajectories(redis_client)
    assert event.model_steps[0].completion_token_ids == llm.responses[0]["choices"][0]["token_ids"]
    assert event.model_steps[0].output == "The sum is 5"


def test_routing_champion_canary_sticky_and_pinned(start_api, llm, redis_client):
    llm.responder = lambda request: Reply(content="ok")
    redis_client.hset(POLICY_ALIASES, mapping={"champion": "v1", "candidate": "v2"})
    api = start_api(canary_share=1.0)
    client = sdk(api, run="canary-1")
    ask(client)
    ask(client)
    ask(client, model="arloop@v7")
    ask(sdk(api, run="canary-2"))
    assert [r["model"] for r in llm.requests] == [
        "arloop@candidate",
        "arloop@candidate",
        "arloop@v7",
        "arloop@candidate",
    ]
    models = [m.id for m in sdk(api).models.list()]
    assert models[0] == "arloop"
    with pytest.raises(openai.NotFoundError) as missing:
        ask(client, model="gpt-4o")
    assert missing.value.body["param"] == "model"


def test_a_field_the_policy_cannot_honour_is_a_400_naming_it(start_api, llm):
    client = sdk(start_api())
    for extra, param in [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"temperature": "hot"}, "temperature"),
        ({"n": 1.5}, "n"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(client, extra_body=extra)
        assert refused.value.body["param"].startswith(param), (extra, refused.value.body)
    assert llm.requests == []


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (
            b'{"model": "arloop", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            400,
        ),
        (
            b'{"model": "arloop", "messages": [{"role": "user", "content": "hi"}], "seed": Infinity}',
            400,
        ),
        (
            b'{"model": "arloop", "messages": [{"role": "user", "content": "hi"}], "x": '
            + b"[" * 40
            + b"]" * 40
            + b"}",
            400,
        ),
        (
            b'{"model": "arloop", "messages": [{"role": "user", "content": "hi"}], "x": '
            + b"[" * 5000
            + b"]" * 5000
            + b"}",
            400,
        ),
        (b'{"model": "arloop", "messages": "hi"}', 400),
        (b'["not", "an", "object"]', 400),
        (
            b'{"model": "arloop", "messages": [{"role": "user", "content": "'
            + b"a" * 300_000
            + b'"}]}',
            413,
        ),
    ],
)
def test_bad_bodies_are_a_clear_4xx(start_api, llm, content, status):
    api = start_api()
    answer = api.http.post(
        "/v1/chat/completions", content=content, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == status, answer.text
    assert llm.requests == []


def test_a_run_id_of_another_key_is_403(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(api_keys=[API_KEY, OTHER_KEY])
    ask(sdk(api, run="shared"))
    with pytest.raises(openai.PermissionDeniedError):
        ask(sdk(api, run="shared", key=OTHER_KEY))


def test_an_ended_run_is_409(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api()
    client = sdk(api, run="once")
    headers, _ = ask(client)
    assert end(api, headers["X-Arloop-Trajectory"], "ok").status_code == 200
    with pytest.raises(openai.ConflictError) as closed:
        ask(client)
    assert "closed (ended)" in closed.value.message
    again = end(api, headers["X-Arloop-Trajectory"], "ok")
    assert again.status_code == 409 and "already closed" in again.json()["detail"]
    assert end(api, headers["X-Arloop-Trajectory"], "ok", key=OTHER_KEY).status_code == 401


def test_a_run_is_ended_by_the_run_id_its_calls_named(start_api, llm, redis_client):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(api_keys=[API_KEY, OTHER_KEY])
    headers, _ = ask(sdk(api, run="job-7"))

    def end_named(run: str | None, key: str = API_KEY) -> httpx.Response:
        named = {"X-Arloop-Run": run} if run is not None else {}
        auth = {"Authorization": f"Bearer {key}"}
        return api.http.post("/v1/runs/end", json={"output": "ok"}, headers=auth | named)

    assert end_named("job-7", key=OTHER_KEY).status_code == 403  # the run is API_KEY's
    assert end_named("job-8").status_code == 404 and "job-8" in end_named("job-8").json()["detail"]
    missing = end_named(None)
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["header", "X-Arloop-Run"]
    assert end_named("bad id").status_code == 422
    ended = end_named("job-7")
    assert ended.status_code == 200, ended.text
    assert ended.json()["trajectory_id"] == headers["X-Arloop-Trajectory"]
    [event] = trajectories(redis_client)
    assert (event.trajectory_id, event.output) == (headers["X-Arloop-Trajectory"], "ok")
    assert end_named("job-7").status_code == 409  # ended once


def test_a_dropped_stream_logs_the_run_as_cancelled(start_api, llm, redis_client):
    llm.push(Reply(content="one two three four five six seven eight", chunk_delay_s=0.3))
    api = start_api()
    body = {
        "model": "arloop",
        "messages": [{"role": "user", "content": "count"}],
        "stream": True,
    }
    headers = {"X-Arloop-Run": "dropped"}
    with api.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        trajectory_id = response.headers["X-Arloop-Trajectory"]
        for line in response.iter_lines():
            if '"one"' in line:
                break  # leave after the first word
    event = wait_for_trajectory(redis_client)
    assert (event.trajectory_id, event.status) == (trajectory_id, RunStatus.CANCELLED)
    assert event.metadata["arloop.closed_by"] == "cancelled"
    assert event.model_steps[0].output.startswith("one")
    with pytest.raises(openai.ConflictError):
        ask(sdk(api, run="dropped"))


def test_an_upstream_without_token_ids_is_a_text_only_run(start_api, llm, redis_client):
    llm.push(Reply(content="plain", token_info=False))
    api = start_api()
    headers, _ = ask(sdk(api, run="text-only"))
    assert end(api, headers["X-Arloop-Trajectory"], "plain").status_code == 200
    [event] = trajectories(redis_client)
    assert event.model_steps[0].completion_token_ids is None
    assert event.metadata["arloop.text_only"] == "true"
    agent = plain_key(API_KEY)["name"]
    assert f'arloop_text_only_runs_total{{agent="{agent}"}} 1.0' in api.http.get("/metrics").text


def test_a_call_over_the_token_budget_is_429(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    api = start_api(chat_tokens_per_minute=100)
    api.hold_rate_window()  # both calls in one minute's window
    client = sdk(api)
    ask(client, max_tokens=60)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client, max_tokens=60)
    assert "ARLOOP_CHAT_TOKENS_PER_MINUTE" in refused.value.message
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert len(llm.requests) == 1


def test_a_run_left_open_is_closed_after_its_idle_time(start_api, llm, redis_client):
    llm.push(Reply(content="last words"))
    api = start_api(run_idle_s=0.3)
    headers, _ = ask(sdk(api, run="forgotten"))
    event = wait_for_trajectory(redis_client)
    assert event.trajectory_id == headers["X-Arloop-Trajectory"]
    assert (event.output, event.metadata["arloop.closed_by"]) == ("last words", "idle")


def test_the_end_user_is_bound_by_the_keys_identity(start_api, llm, redis_client):
    llm.responder = lambda request: Reply(content="ok")
    bound = {"key": OTHER_KEY, "name": "ann-app", "identity": "user", "user": "ann"}
    api = start_api(api_keys=[API_KEY, bound])
    with pytest.raises(openai.PermissionDeniedError):
        ask(sdk(api, key=OTHER_KEY), user="bob")
    runs = [
        (ask(sdk(api, run="r", key=OTHER_KEY))[0], OTHER_KEY, "ann"),
        (ask(sdk(api, run="u"), user="carol")[0], API_KEY, "carol"),
        (ask(sdk(api, run="h", **{"X-Arloop-User": "dave"}))[0], API_KEY, "dave"),
    ]
    for headers, key, _ in runs:
        assert end(api, headers["X-Arloop-Trajectory"], "ok", key=key).status_code == 200
    assert [e.user_id for e in trajectories(redis_client)] == [api.stored(u) for *_, u in runs]


def test_phi_is_scrubbed_before_the_run_reaches_redis(start_api, llm, redis_client):
    llm.push(Reply(content="Rest well, Alice."), Reply(content="Yes."))
    api = start_api(scrubber=lambda t: t.replace("Alice", "<PERSON>"))
    headers, answer = ask(sdk(api, run="phi"), text="I am Alice and I cough.")
    assert answer.choices[0].message.content == "Rest well, Alice."
    parts = [{"type": "text", "text": "Alice again."}]
    ask(sdk(api, run="phi"), messages=[{"role": "user", "content": parts}])
    kept = b"".join(
        v for k in redis_client.scan_iter("arloop:ext:*") for v in _values(redis_client, k)
    )
    assert b"Alice" not in kept and b"<PERSON>" in kept
    assert end(api, headers["X-Arloop-Trajectory"], "Rest well, Alice.").status_code == 200
    [(_, fields)] = redis_client.xrange(STREAM_TRAJECTORIES)
    assert b"Alice" not in fields[b"data"] and b"<PERSON>" in fields[b"data"]


@pytest.mark.parametrize("before_the_model", [True, False])
def test_a_prompt_with_phi_is_scrubbed_before_the_model_so_its_run_trains(
    start_api, llm, redis_client, before_the_model
):
    llm.push(Reply(content="Rest well."))
    api = start_api(
        scrubber=lambda t: t.replace("Alice", "<PERSON>"), chat_scrub_prompts=before_the_model
    )
    headers, _ = ask(sdk(api, run="phi"), text="I am Alice and I cough.")
    assert end(api, headers["X-Arloop-Trajectory"], "Rest well.").status_code == 200
    [event] = trajectories(redis_client)
    [step] = event.model_steps
    sent = llm.requests[0]["messages"][0]["content"]
    assert step.messages[0]["content"] == "I am <PERSON> and I cough."  # stored scrubbed, always
    if before_the_model:  # the model read what is stored: its token ids are the prompt's
        assert sent == "I am <PERSON> and I cough."
        assert step.prompt_token_ids == llm.responses[0]["prompt_token_ids"]
        assert "arloop.text_only" not in event.metadata
    else:  # the model read the name: the stored text is not what its token ids say
        assert sent == "I am Alice and I cough."
        assert step.prompt_token_ids is None and event.metadata["arloop.text_only"] == "true"


def _values(client, key) -> list[bytes]:
    kind = client.type(key)
    if kind == b"hash":
        return list(client.hgetall(key).values())
    if kind == b"string":
        return [client.get(key)]
    return []


def test_a_run_on_the_tiny_policy_server_keeps_its_real_tokens(start_api, redis_url, redis_client):
    with running_server(tiny_settings(redis_url)) as base:
        api = start_api(policy_api_base=base, policy_api_key="none", policy_max_tokens=6)
        client = sdk(api, run="tiny")
        history = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            headers, answer = ask(client, messages=history, temperature=0.0)
            history += [{"role": "assistant", "content": answer.choices[0].message.content}]
            history += [{"role": "user", "content": "more"}]
        assert end(api, headers["X-Arloop-Trajectory"], "done").status_code == 200
    [event] = trajectories(redis_client)
    steps = event.model_steps
    assert len(steps) == 3 and headers["X-Arloop-Policy-Version"] == "v0"
    assert all(s.prompt_token_ids and s.completion_token_ids for s in steps)
    assert all(len(s.logprobs) == len(s.completion_token_ids) for s in steps)
    assert len(steps[2].prompt_token_ids) > len(steps[0].prompt_token_ids)


def test_the_docs_example_runs_ends_and_rates_a_run(start_api, llm, redis_client, monkeypatch):
    llm.push(Reply(content="391"))
    api = start_api()
    monkeypatch.setenv("ARLOOP_URL", api.server.url)
    monkeypatch.setenv("ARLOOP_KEY", API_KEY)
    runpy.run_path(str(Path(__file__).with_name("openai_sdk_run.py")))
    [event] = trajectories(redis_client)
    assert (event.agent, event.output, len(event.model_steps)) == ("my-bot", "391", 1)
    [rating] = [decode(f) for _, f in redis_client.xrange(STREAM_FEEDBACK)]
    assert rating.trajectory_id == event.trajectory_id and rating.value == 1


def test_the_policys_own_refusal_is_a_400_and_the_run_goes_on(start_api, llm):
    llm.push(Reply(status=400), Reply(content="fine"))
    client = sdk(start_api(), run="refused")
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client)
    assert refused.value.body["message"] == "the policy refused: scripted failure"
    headers, answer = ask(client)
    assert answer.choices[0].message.content == "fine"


def test_a_policy_that_does_not_answer_in_time_is_a_504_and_the_run_goes_on(start_api, llm):
    llm.push(Reply(content="late", delay_s=3.0), Reply(content="fine"))
    client = sdk(start_api(policy_timeout_s=1.0), run="slow")
    with pytest.raises(openai.APIStatusError) as late:
        ask(client)
    assert late.value.status_code == 504 and "timed out after 1 s" in late.value.message
    headers, answer = ask(client)
    assert answer.choices[0].message.content == "fine"


def test_every_choice_of_n_is_recorded_choice_0_in_the_run(start_api, redis_url, redis_client):
    """n > 1: choice 0 continues the run (its headers, its token); each other choice is a
    one-step sibling trajectory, grouped by the learner with the run's step of the same prompt."""
    from agents.events import ModelStep
    from learner.samples import group_key

    with running_server(tiny_settings(redis_url)) as base:
        api = start_api(policy_api_base=base, policy_api_key="none", policy_max_tokens=6)
        client = sdk(api, run="three-ways")
        history = [{"role": "user", "content": "hi"}]
        headers, answer = ask(client, messages=history, n=3, temperature=1.0, seed=5)
        history += [{"role": "assistant", "content": answer.choices[0].message.content}]
        history += [{"role": "user", "content": "more"}]
        streamed = client.chat.completions.create(
            model="arloop", messages=history, n=2, temperature=1.0, seed=6, stream=True
        )
        texts: dict[int, str] = {}
        for chunk in streamed:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        run = headers["X-Arloop-Trajectory"]
        assert end(api, run, "done").status_code == 200
    *siblings, event = trajectories(redis_client)
    assert event.event_id == run and len(event.model_steps) == 2
    assert event.model_steps[0].output == answer.choices[0].message.content
    by_choice = {(s.metadata["arloop.call"], s.metadata["arloop.choice"]): s for s in siblings}
    assert sorted(by_choice) == [("0", "1"), ("0", "2"), ("1", "1")]
    for (call, choice), sibling in by_choice.items():
        [step] = sibling.steps
        assert isinstance(step, ModelStep) and step.index == 0
        assert sibling.metadata["arloop.sibling_of"] == run and sibling.status == RunStatus.OK
        assert step.prompt_token_ids and len(step.logprobs) == len(step.completion_token_ids)
        want = answer.choices[int(choice)].message.content if call == "0" else texts[1]
        assert step.output == want and sibling.user_id == event.user_id
    assert group_key(by_choice[("0", "1")]) == group_key(by_choice[("0", "2")]) == group_key(event)
    assert group_key(by_choice[("1", "1")]) != group_key(event)
