"""The policy server under hostile input and failing state, over real HTTP, both engines:
every bad body a 4xx with a reason (never a 500), API keys, rejected versions for the gate
alone, `/healthz` when the champion cannot load, and a rewound registry said."""

import json
import secrets
import threading
import time

import httpx
import pytest
import redis

from agents.events import POLICY_ALIASES, POLICY_VERSIONS, policy_version_key
from learner.policy.registry import PolicyRegistry
from tests.deploy.policy_server.support import (
    ENGINES,
    make_lora,
    publish,
    running_server,
    tiny_settings,
)

AGENTS_KEY = "agents-key-Qx7fT2mLp9Zr4vKc8WnB3yHd"
GATE_KEY = "gate-key-Vb6Jt1sNq5Xe8Rk2Mz4Lw7Pf"
HI = [{"role": "user", "content": "hi"}]
NESTED_ARGS = "[" * 100_000 + "]" * 100_000


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture
def server(redis_url, engine):
    settings = tiny_settings(redis_url, policy_engine=engine, policy_max_body_bytes=512 * 1024)
    with running_server(settings) as base:
        yield base


def _chat(base: str, body, headers=None) -> httpx.Response:
    """POST as JSON; lone surrogates travel as `\\ud800` escapes, as JSON allows."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    data = json.dumps(body).encode()  # ensure_ascii: escapes, never unencodable text
    return httpx.post(f"{base}/chat/completions", content=data, headers=headers, timeout=60)


def _body(**extra):
    return {"model": "arloop", "messages": HI, "max_tokens": 2, **extra}


def _deep(n: int) -> dict:
    out: dict = {"type": "object"}
    for _ in range(n):
        out = {"type": "object", "properties": {"a": out}}
    return out


HOSTILE = {
    "surrogate content": (
        _body(messages=[{"role": "user", "content": "\ud800"}]),
        "messages.0.content",
    ),
    "surrogate stop": (_body(stop=["\udfff"]), "stop.0"),
    "surrogate key": (_body(logit_bias={"\ud800": 1}), "logit_bias"),
    "seed 2^70": (_body(seed=2**70), "seed"),
    "seed -2^70": (_body(seed=-(2**70)), "seed"),
    "nested tool_calls arguments": (
        _body(
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "calculator", "arguments": NESTED_ARGS}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "1"},
            ]
        ),
        "messages",
    ),
    "nested body": (
        _body(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "deep", "schema": _deep(40)},
            }
        ),
        "response_format",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bodies_are_a_400_with_a_reason(server, case):
    body, param = HOSTILE[case]
    r = _chat(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param), error
    assert error["message"]


def test_a_20_mb_body_is_refused_before_it_is_read(server):
    big = {"model": "arloop", "messages": [{"role": "user", "content": "a" * 20_000_000}]}
    answered = []

    def probe():
        while len(answered) < 1:
            t = time.monotonic()
            httpx.get(server.removesuffix("/v1") + "/healthz", timeout=10)
            answered.append(time.monotonic() - t)

    watcher = threading.Thread(target=probe)
    watcher.start()
    r = _chat(server, big)
    watcher.join(timeout=30)
    assert r.status_code == 413 and "ARLOOP_POLICY_MAX_BODY_BYTES" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(400):
            yield b"x" * 50_000

    r = httpx.post(f"{server}/chat/completions", content=chunks(), timeout=60)
    assert r.status_code == 413
    assert answered and answered[0] < 5  # the event loop was never blocked


def test_an_unsupported_parameter_is_named(server):
    r = _chat(server, _body(best_of=3))
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    assert r.json()["error"]["code"] == "unsupported_parameter"


def test_api_keys_and_rejected_versions(redis_url, engine, tmp_path):
    registry = PolicyRegistry(redis.Redis.from_url(redis_url))
    registry.ensure_base("tiny")
    v1 = publish(registry, "lora", make_lora(tmp_path / "a", seed=1), champion=False)
    registry.reject(v1, error="the gate said no")
    keys = [AGENTS_KEY, {"key": GATE_KEY, "name": "learner", "gate": True}]
    settings = tiny_settings(redis_url, policy_engine=engine, policy_keys=keys)
    with running_server(settings) as base:
        agents = {"Authorization": f"Bearer {AGENTS_KEY}"}
        gate = {"Authorization": f"Bearer {GATE_KEY}"}
        assert _chat(base, _body()).status_code == 401
        wrong = {"Authorization": "Bearer " + AGENTS_KEY[:-1] + "x"}
        assert _chat(base, _body(), headers=wrong).status_code == 401
        assert httpx.get(f"{base}/models").status_code == 401
        assert _chat(base, _body(), headers=agents).status_code == 200
        refused = _chat(base, _body(model=f"arloop@{v1}"), headers=agents)
        assert refused.status_code == 403 and "rejected" in refused.json()["error"]["message"]
        assert _chat(base, _body(model=f"arloop@{v1}"), headers=gate).status_code == 200
        seen = {m["id"] for m in httpx.get(f"{base}/models", headers=agents).json()["data"]}
        assert f"arloop@{v1}" not in seen and "arloop@v0" in seen
        seen = {m["id"] for m in httpx.get(f"{base}/models", headers=gate).json()["data"]}
        assert f"arloop@{v1}" in seen
        health = httpx.get(base.removesuffix("/v1") + "/healthz")
        assert health.status_code == 200  # probes need no key


def test_no_keys_means_nobody_samples_a_rejected_version(redis_url, engine, tmp_path):
    registry = PolicyRegistry(redis.Redis.from_url(redis_url))
    registry.ensure_base("tiny")
    v1 = publish(registry, "lora", make_lora(tmp_path / "a", seed=1), champion=False)
    registry.reject(v1, error="no")
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base:
        assert _chat(base, _body(model=f"arloop@{v1}")).status_code == 403


def test_healthz_is_503_while_the_champion_cannot_load(redis_url, engine, tmp_path):
    registry = PolicyRegistry(redis.Redis.from_url(redis_url))
    registry.ensure_base("tiny")
    folder = tmp_path / "gone"
    folder.mkdir()  # a checkpoint folder with nothing in it
    v1 = publish(registry, "lora", folder)
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base:
        health = httpx.get(base.removesuffix("/v1") + "/healthz")
        assert health.status_code == 503, health.text
        body = health.json()
        assert body["status"] == "degraded" and body["serving"]["champion"] == "v0"
        assert v1 in body["problems"][0] and "cannot load" in body["problems"][0]
        assert _chat(base, _body()).status_code == 200  # still serving the base meanwhile


def test_a_rewound_registry_is_said(redis_url, engine, tmp_path):
    client = redis.Redis.from_url(redis_url)
    registry = PolicyRegistry(client)
    registry.ensure_base("tiny")
    v1 = publish(registry, "lora", make_lora(tmp_path / "a", seed=1))
    settings = tiny_settings(redis_url, policy_engine=engine, reload_poll_s=0.2)
    with running_server(settings) as base:
        v2 = publish(registry, "lora", make_lora(tmp_path / "b", seed=2))
        _wait(lambda: _health(base)["serving"]["champion"] == v2)
        # what restoring an older append-only file does: v2 gone, champion back to v1
        client.delete(policy_version_key(v2))
        client.zrem(POLICY_VERSIONS, v2)
        client.hset(POLICY_ALIASES, "champion", v1)
        _wait(lambda: _health(base)["serving"]["champion"] == v1)
        notices = _health(base)["notices"]
        assert notices and "rewound" in notices[0] and v2 in notices[0], notices


def _health(base: str) -> dict:
    return httpx.get(base.removesuffix("/v1") + "/healthz").json()


def _wait(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_key_spends_its_tokens_a_minute_then_waits(redis_url, engine):
    keys = [AGENTS_KEY, {"key": GATE_KEY, "name": "learner", "gate": True}]
    settings = tiny_settings(
        redis_url, policy_engine=engine, policy_keys=keys, key_tokens_per_minute=10
    )
    agents = {"Authorization": f"Bearer {AGENTS_KEY}"}
    with running_server(settings) as base:
        assert _chat(base, _body(max_tokens=4, n=2), headers=agents).status_code == 200
        over = _chat(base, _body(max_tokens=3), headers=agents)  # 8 + 3 > 10
        assert over.status_code == 429 and "ARLOOP_KEY_TOKENS_PER_MINUTE" in over.text
        assert 1 <= int(over.headers["Retry-After"]) <= 60
        assert _chat(base, _body(max_tokens=2), headers=agents).status_code == 200  # 10: fits
        gate = {"Authorization": f"Bearer {GATE_KEY}"}
        assert _chat(base, _body(max_tokens=8), headers=gate).status_code == 200  # its own


def test_token_budget_window_slides():
    from deploy.credentials import PolicyKey
    from deploy.policy_server.access import TokenBudget
    from deploy.policy_server.openai_wire import OpenAIError

    budget, key = TokenBudget(100), PolicyKey(key="k" * 30, name="a")
    budget.take(key, 60, now=0.0)
    budget.take(key, 40, now=30.0)
    with pytest.raises(OpenAIError) as info:
        budget.take(key, 1, now=59.0)
    assert info.value.status == 429 and info.value.retry_after == 1
    budget.take(key, 60, now=60.0)  # the first 60 left the window


def test_production_needs_strong_policy_keys():
    from deploy.policy_server.settings import PolicyServerSettings

    redis_url = f"redis://u:{secrets.token_urlsafe(32)}@redis:6379"  # a production-strong one
    base = {"_env_file": None, "env": "production", "redis_url": redis_url}
    with pytest.raises(ValueError, match="ARLOOP_POLICY_KEYS is empty"):
        PolicyServerSettings(**base)
    with pytest.raises(ValueError, match="too weak"):
        PolicyServerSettings(**base, policy_keys=["a"])
    assert PolicyServerSettings(**base, policy_keys=[AGENTS_KEY]).policy_keys[0].name
