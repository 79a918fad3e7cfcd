"""Any litellm provider: what each endpoint kind is asked for, a strict hosted-style endpoint
over real HTTP (400 for `logprobs` and `return_token_ids`), litellm's Router falling back from
a down primary, per-agent models, and such runs logged without token ids."""

from __future__ import annotations

import json

import pytest

from agents.events import STREAM_TRAJECTORIES, decode
from agents.model_routes import Endpoint, ModelRoute, endpoint_kind, token_params
from agents.policy_client import Generation, PolicyClient, PolicyConfig, PolicyError
from deploy.embedded_redis import free_port
from tests.fakes.scripted_llm import Reply
from tests.fakes.servers import ServerThread
from tests.fakes.strict_openai import StrictProvider

HI = [{"role": "user", "content": "hi"}]
DOWN = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connection refused


@pytest.fixture
def strict():
    """The strict hosted-style provider over real HTTP; `strict.base_url` ends in /v1."""
    fake = StrictProvider()
    with ServerThread(fake.app) as server:
        fake.base_url = f"{server.url}/v1"
        yield fake


@pytest.mark.parametrize(
    ("model", "provider", "kind"),
    [
        ("openai/arloop", "auto", "arloop"),
        ("openai/arloop@v3", "auto", "arloop"),
        ("hosted_vllm/Qwen/Qwen2.5-7B", "auto", "vllm"),
        ("openai/gpt-4o-mini", "auto", "other"),
        ("anthropic/claude-3-5-haiku-latest", "auto", "other"),
        ("ollama_chat/llama3", "auto", "other"),
        ("openai/arloop-tutor", "auto", "other"),
        ("openai/my-served-name", "arloop", "arloop"),
        ("openai/qwen", "vllm", "vllm"),
        ("openai/arloop", "other", "other"),
    ],
)
def test_the_endpoint_kind_comes_from_the_model_string_unless_told(model, provider, kind):
    assert endpoint_kind(model, provider) == kind
    asks = token_params(kind)
    assert ("logprobs" in asks) == (kind != "other")
    assert ("drop_params" in asks) == (kind == "other")


def test_versioned_names_are_for_our_server_only():
    ours = PolicyClient(PolicyConfig(model="openai/arloop"))
    assert ours.model_for("candidate") == "openai/arloop@candidate"
    for model, provider in [("hosted_vllm/qwen", "auto"), ("anthropic/claude-3-5-haiku", "auto")]:
        config = PolicyConfig(model=model, provider=provider)
        assert not config.names_versions and PolicyClient(config).model_for("candidate") == model
    assert PolicyConfig(model="hosted_vllm/qwen").versions_routed  # vLLM: arms by adapter
    assert not PolicyConfig(model="anthropic/claude-3-5-haiku").versions_routed  # no canary


async def test_the_strict_endpoint_refuses_what_hosted_providers_refuse(strict):
    told_vllm = PolicyConfig(
        model="openai/gpt-strict", api_base=strict.base_url, api_key="k", retries=0, provider="vllm"
    )
    with pytest.raises(PolicyError) as err:
        await PolicyClient(told_vllm).complete(HI)
    assert err.value.status == 502 and "not supported" in err.value.reason
    assert strict.refused[0]["logprobs"] is True and not strict.accepted


async def test_another_provider_is_called_plainly_and_logged_without_token_ids(strict):
    strict.push(Reply(content="Hello."), Reply(content="Stopped"))
    config = PolicyConfig(
        model="openai/gpt-strict", api_base=strict.base_url, api_key="k", retries=0, seed=7
    )
    step = await PolicyClient(config).complete(HI, arm="champion")
    sent = strict.accepted[0]
    assert sent["model"] == "gpt-strict" and sent["seed"] == 7  # no @champion, OpenAI's seed kept
    assert not {"logprobs", "return_token_ids", "extra_body"} & set(sent)
    assert (step.output, step.model, step.policy_version) == (
        "Hello.",
        "openai/gpt-strict",
        "openai/gpt-strict",  # not the provider's fingerprint, which is no arloop version
    )
    assert step.prompt_token_ids is None and step.completion_token_ids is None
    assert step.logprobs is None
    keep_stop = Generation(stop=("Triage:",), include_stop=True)  # vLLM's field: not sent here
    await PolicyClient(config).complete(HI, sampling=keep_stop)
    assert strict.accepted[1]["stop"] == ["Triage:"]
    assert "include_stop_str_in_output" not in strict.accepted[1] and not strict.refused


async def test_a_down_primary_falls_back_to_the_next_endpoint(strict, llm):
    strict.push(Reply(content="from the fallback"))
    config = PolicyConfig(
        model="openai/arloop",
        api_base=DOWN,
        api_key="k",
        retries=1,
        fallbacks=(Endpoint(model="openai/gpt-strict", api_base=strict.base_url, api_key="k"),),
    )
    step = await PolicyClient(config).complete(HI, arm="candidate")
    assert (step.output, step.model, step.policy_version) == (
        "from the fallback",
        "openai/gpt-strict",
        "openai/gpt-strict",
    )
    assert step.completion_token_ids is None and not strict.refused
    # the primary up: it answers, versioned, with its token ids; the fallback is not called
    llm.fingerprints = {"arloop@candidate": "v3"}
    llm.push(Reply(content="from arloop"))
    up = PolicyClient(PolicyConfig(**{**vars(config), "api_base": llm.base_url}))
    step = await up.complete(HI, arm="candidate")
    assert (step.output, step.model, step.policy_version) == (
        "from arloop",
        "openai/arloop@candidate",
        "v3",
    )
    assert step.completion_token_ids and llm.requests[0]["return_token_ids"] is True
    assert len(strict.accepted) == 1


async def test_a_streamed_call_falls_back_too(strict):
    strict.push(Reply(content="streamed from the fallback"))
    config = PolicyConfig(
        model="openai/arloop",
        api_base=DOWN,
        api_key="k",
        retries=0,
        fallbacks=(Endpoint(model="openai/gpt-strict", api_base=strict.base_url, api_key="k"),),
    )
    pieces: list[str] = []
    step = await PolicyClient(config).complete(HI, on_delta=pieces.append)
    assert "".join(pieces) == step.output == "streamed from the fallback"
    assert step.model == step.policy_version == "openai/gpt-strict"


async def test_every_endpoint_down_is_a_502_naming_the_failure():
    config = PolicyConfig(
        model="openai/arloop",
        api_base=DOWN,
        api_key="k",
        retries=0,
        fallbacks=(Endpoint(model="openai/gpt-strict", api_base=DOWN, api_key="k"),),
    )
    with pytest.raises(PolicyError) as err:
        await PolicyClient(config).complete(HI)
    assert err.value.status == 502


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("anthropic/claude-3-5-haiku-latest", "/v1/messages"),
        ("ollama_chat/llama3", "/api/chat"),
        ("ollama/llama3", "/api/generate"),
    ],
)
async def test_litellm_providers_get_a_request_they_take(model, path):
    """Each reaches its own wire (this fake answers 404 there): no UnsupportedParamsError for
    logprobs, a seed or penalties, as every call to these failed before (issue 17)."""
    fake = StrictProvider()
    seen: list[str] = []

    @fake.app.middleware("http")
    async def record(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    sampling = Generation(frequency_penalty=0.1, stop=("x",), include_stop=True)
    with ServerThread(fake.app) as server:
        config = PolicyConfig(model=model, api_base=server.url, api_key="k", retries=0, seed=3)
        with pytest.raises(PolicyError) as err:
            await PolicyClient(config).complete(HI, arm="champion", sampling=sampling)
    assert seen == [path] and "NotFoundError" in err.value.reason


def _trajectories(redis_url) -> list:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return [decode(fields) for _, fields in client.xrange(STREAM_TRAJECTORIES)]
    finally:
        client.close()


def test_an_agent_on_another_provider_runs_and_logs_an_untrainable_run(
    start_api, strict, redis_url
):
    strict.push(Reply(content="The answer is 5."))
    api = start_api(policy_model="openai/gpt-strict", policy_api_base=strict.base_url)
    r = api.run("what is 2 plus 3?")
    assert r.status_code == 200, r.text
    assert r.json()["output"] == "The answer is 5."
    assert r.json()["policy_version"] == "openai/gpt-strict"
    assert not strict.refused
    (logged,) = _trajectories(redis_url)
    (step,) = logged.model_steps
    assert step.model == "openai/gpt-strict" and step.completion_token_ids is None
    assert step.prompt_token_ids is None and step.logprobs is None


def test_one_agent_has_its_own_model_with_a_fallback(start_api, strict, llm, redis_url):
    strict.scripted.responder = lambda request: Reply(content="The answer is 5.")
    llm.push(Reply(content="tutor: from the process's policy"))
    route = ModelRoute(
        model="openai/arloop",
        api_base=DOWN,
        fallbacks=(Endpoint(model="openai/gpt-strict", api_base=strict.base_url, api_key="k"),),
    )
    api = start_api(agent_models={"solver": route})
    solver = api.run("what is 2 plus 3?", agent="solver")
    assert solver.status_code == 200, solver.text
    assert solver.json()["output"] == "The answer is 5."
    tutor = api.run("what is 2 plus 3?", agent="tutor")
    assert tutor.status_code == 200, tutor.text
    assert tutor.json()["output"] == "tutor: from the process's policy"
    assert [r["model"] for r in llm.requests] == ["arloop@champion"]  # the process's: versioned
    assert strict.accepted and not strict.refused
    by_agent = {t.agent: t.model_steps for t in _trajectories(redis_url)}
    assert {s.model for s in by_agent["solver"]} == {"openai/gpt-strict"}
    assert all(s.completion_token_ids is None for s in by_agent["solver"])
    assert by_agent["tutor"][0].completion_token_ids  # ours: trainable


def test_agent_models_are_read_from_the_environment_and_unknown_agents_refused(monkeypatch):
    from deploy.agent_api.app import create_app
    from deploy.settings import AgentApiSettings

    models = {"tutor": {"model": "anthropic/claude-3-5-haiku-latest", "retries": 1}}
    monkeypatch.setenv("ARLOOP_AGENT_MODELS", json.dumps(models))
    monkeypatch.setenv(
        "ARLOOP_POLICY_FALLBACKS", json.dumps([{"model": "openai/gpt-4o-mini", "api_key": "sk"}])
    )
    s = AgentApiSettings(_env_file=None)
    assert s.agent_models["tutor"].kind == "other" and s.agent_models["tutor"].retries == 1
    assert s.policy_config().fallbacks[0].key() == "sk"
    assert "sk" not in repr(s.policy_config().fallbacks)  # keys stay secret in logs
    monkeypatch.setenv("ARLOOP_AGENT_MODELS", json.dumps({"tutr": {"model": "openai/x"}}))
    from agents.model_routes import ModelRouteError

    with pytest.raises(ModelRouteError, match="names 'tutr', which no served pack has"):
        create_app(AgentApiSettings(_env_file=None, packs=["tutoring"]))
