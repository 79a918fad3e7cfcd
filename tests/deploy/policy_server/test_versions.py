"""Versions and hot reload: swaps under load with no failed request, broken checkpoints, `@vN`.

Every test runs against both engines: the llama.cpp engine exports each version to GGUF on
load, which is what a swap under load exercises there.
"""

import itertools
import threading
import time

import httpx
import pytest
import torch

from agents.events import POLICY_ALIASES
from deploy.policy_server.versions import VersionManager, in_own_thread
from learner.logprobs import completion_logprobs
from learner.policy.models import load_version
from learner.policy.registry import CANDIDATE, CHAMPION, PolicyRegistry, VersionStatus
from tests.deploy.policy_server.support import (
    ENGINES,
    make_full,
    make_lora,
    publish,
    running_server,
    tiny_settings,
)
from tests.model_cache import MODEL_CACHE

HI = [{"role": "user", "content": "hi"}]
LOGPROB_ATOL = {"transformers": 1e-4, "llamacpp": 5e-3}  # see test_app.py


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


def _ask(base: str, model: str = "arloop", **extra) -> httpx.Response:
    body = {
        "model": model,
        "messages": HI,
        "max_tokens": 6,
        "logprobs": True,
        "return_token_ids": True,
        **extra,
    }
    return httpx.post(f"{base}/chat/completions", json=body, timeout=60)


def _wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _health(base: str) -> dict:
    return httpx.get(base.removesuffix("/v1") + "/healthz").json()


def _metrics(base: str) -> str:
    return httpx.get(base.removesuffix("/v1") + "/metrics").text


def _max_error(model, body: dict) -> float:
    """Largest |served - recomputed| logprob of a response under `model`."""
    choice = body["choices"][0]
    served = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
    ref = completion_logprobs(model, body["prompt_token_ids"], choice["token_ids"], 0)
    return float((served - ref).abs().max())


class Load:
    """Clients sending requests in a loop, keeping every response and every failure."""

    def __init__(self, base: str, clients: int = 3) -> None:
        self.base, self.ok, self.failed = base, [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(clients)]

    def _loop(self, i: int) -> None:
        with httpx.Client(timeout=60) as http:
            for n in itertools.count():
                if self.stop.is_set():
                    break
                body = {
                    "model": "arloop",
                    "messages": [{"role": "user", "content": "hi" * (i + 1)}],
                    "max_tokens": 4 + i,
                    "temperature": 1.0,
                    "seed": 1000 * i + n,  # each request's sample fixed by its place
                    "logprobs": True,
                    "return_token_ids": True,
                }
                try:
                    r = http.post(f"{self.base}/chat/completions", json=body)
                    (self.ok if r.status_code == 200 else self.failed).append(
                        r.json() if r.status_code == 200 else r.text
                    )
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))

    def seen(self, version: str) -> bool:
        return any(b["system_fingerprint"] == version for b in list(self.ok))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def test_hot_swap_under_load_fails_nothing_and_fingerprints_are_true(
    engine, redis_client, redis_url, tmp_path
):
    registry = PolicyRegistry(redis_client)
    makers = [("lora", make_lora), ("full", make_full), ("lora", make_lora)]
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base, Load(base) as load:
        _wait_for(lambda: load.seen("v0"), what="a first response")
        versions = ["v0"]
        for i, (kind, make) in enumerate(makers):
            folder = make(tmp_path / f"ckpt{i}", seed=10 + i)
            versions.append(publish(registry, kind, folder))
            _wait_for(lambda v=versions[-1]: load.seen(v), what=f"a response from {versions[-1]}")
        # every replaced version is freed once the requests that were on it finish
        _wait_for(lambda: _health(base)["loaded"] == [versions[-1]], what="old versions freed")
    assert load.failed == []
    models = {v: load_version(registry.get(v), cache_dir=MODEL_CACHE)[0] for v in versions}
    assert {b["system_fingerprint"] for b in load.ok} == set(versions)
    for body in load.ok:
        named = body["system_fingerprint"]
        own = _max_error(models[named], body)
        assert own < LOGPROB_ATOL[engine]
        # The fingerprint is discriminating: no other version explains these logprobs.
        assert all(
            _max_error(m, body) > max(1e-3, 2 * own) for v, m in models.items() if v != named
        )


def test_in_flight_stream_finishes_on_the_old_version(engine, redis_client, redis_url, tmp_path):
    registry = PolicyRegistry(redis_client)
    settings = tiny_settings(redis_url, policy_engine=engine, max_tokens_cap=400)
    folder = make_lora(tmp_path / "a", seed=1)
    with running_server(settings) as base:
        # A long response (8 x 400 tokens, fat chunks) that is still running when the alias moves.
        body = {
            "model": "arloop",
            "messages": HI,
            "max_tokens": 400,
            "stream": True,
            "n": 8,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 20,
        }
        with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: "))
            new = publish(registry, "lora", folder)
            _wait_for(lambda: _health(base)["serving"][CHAMPION] == new, what="the swap")
            assert _ask(base).json()["system_fingerprint"] == new
            assert set(_health(base)["loaded"]) == {new}  # v0 is retired, held by this stream
            assert "arloop_policy_loaded_versions 2.0" in _metrics(base)
            rest = [ln for ln in lines if ln.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) > 8 * 400
        assert '"system_fingerprint": "v0"' in first
        assert all('"system_fingerprint": "v0"' in ln for ln in rest[:-1])
        assert "arloop_policy_loaded_versions 1.0" in _metrics(base)


def test_broken_champion_keeps_the_current_version_serving(
    engine, redis_client, redis_url, tmp_path
):
    registry = PolicyRegistry(redis_client)
    bad = make_lora(tmp_path / "bad", seed=2)
    (bad / "adapter_model.safetensors").write_bytes(b"garbage")
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base:
        broken = publish(registry, "lora", bad)
        _wait_for(lambda: registry.get(broken).status is VersionStatus.BROKEN, what="BROKEN")
        record = registry.get(broken)
        assert "does not load" in record.error
        assert _health(base)["serving"] == {CHAMPION: "v0"}
        assert _ask(base).json()["system_fingerprint"] == "v0"
        assert "arloop_policy_load_failures_total 1.0" in _metrics(base)
        r = _ask(base, model=f"arloop@{broken}")
        assert r.status_code == 404 and "broken" in r.json()["error"]["message"]
        good = publish(registry, "full", make_full(tmp_path / "good", seed=3))
        _wait_for(lambda: _ask(base).json()["system_fingerprint"] == good, what="the next good one")


def test_broken_champion_at_start_falls_back_to_the_base(engine, redis_client, redis_url, tmp_path):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    broken = publish(registry, "full", tmp_path / "never-written")
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base:
        assert _ask(base).json()["system_fingerprint"] == "v0"
        assert registry.get(broken).status is VersionStatus.BROKEN


def test_named_versions_load_on_demand_within_the_cap(engine, redis_client, redis_url, tmp_path):
    registry = PolicyRegistry(redis_client)
    with running_server(
        tiny_settings(redis_url, policy_engine=engine, max_loaded_versions=2)
    ) as base:
        names = [
            publish(registry, "lora", make_lora(tmp_path / f"v{i}", seed=20 + i), champion=False)
            for i in range(3)
        ]
        for name in names:
            r = _ask(base, model=f"arloop@{name}")
            assert r.status_code == 200 and r.json()["system_fingerprint"] == name
            assert len(_health(base)["loaded"]) <= 2
        assert _ask(base, model="arloop@v0").json()["system_fingerprint"] == "v0"
        assert _health(base)["serving"] == {CHAMPION: "v0"}
        assert _ask(base, model="arloop@candidate").status_code == 404
        registry.open_candidate(names[0], reason="canary", actor="test")
        _wait_for(lambda: _health(base)["serving"].get(CANDIDATE) == names[0], what="candidate")
        assert _ask(base, model="arloop@candidate").json()["system_fingerprint"] == names[0]
        assert _ask(base).json()["system_fingerprint"] == "v0"


def test_a_missed_notice_is_caught_by_the_periodic_check(engine, redis_client, redis_url, tmp_path):
    registry = PolicyRegistry(redis_client)
    with running_server(tiny_settings(redis_url, policy_engine=engine, reload_poll_s=0.3)) as base:
        name = publish(registry, "lora", make_lora(tmp_path / "x", seed=5), champion=False)
        redis_client.hset(POLICY_ALIASES, CHAMPION, name)  # no pub/sub notice
        _wait_for(lambda: _ask(base).json()["system_fingerprint"] == name, what="the poll")


@pytest.mark.parametrize("model", ["arloop@v0", "arloop@champion", "arloop"])
def test_names_of_the_same_version_agree(engine, redis_url, model):
    with running_server(tiny_settings(redis_url, policy_engine=engine)) as base:
        r = _ask(base, model=model, temperature=0)
        assert r.status_code == 200 and r.json()["system_fingerprint"] == "v0"
        assert r.json()["model"] == model


def test_a_client_that_leaves_mid_stream_releases_its_version(
    engine, redis_client, redis_url, tmp_path
):
    registry = PolicyRegistry(redis_client)
    folder = make_lora(tmp_path / "a", seed=6)
    with running_server(tiny_settings(redis_url, policy_engine=engine, max_tokens_cap=400)) as base:
        body = {"model": "arloop", "messages": HI, "max_tokens": 400, "stream": True, "n": 8}
        with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=60) as stream:
            next(ln for ln in stream.iter_lines() if ln.startswith("data: "))
        new = publish(registry, "lora", folder)  # v0 can only be freed once the stream let go
        _wait_for(lambda: _health(base)["serving"][CHAMPION] == new, what="the swap")
        _wait_for(lambda: "arloop_policy_loaded_versions 1.0" in _metrics(base), what="v0 freed")
        decoded = float(_metric_line(_metrics(base), "arloop_policy_batch_rows_sum"))
        time.sleep(0.5)
        # Its rows were cancelled: no forward pass ran since, and far fewer than 8 x 400 did.
        assert float(_metric_line(_metrics(base), "arloop_policy_batch_rows_sum")) == decoded
        assert decoded < 0.5 * 8 * 400
        assert _ask(base).status_code == 200


def _metric_line(text: str, name: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(name + " ")).split()[-1]


def test_a_version_loads_on_a_thread_that_ends(redis_client):
    """Loading runs torch, whose OpenMP keeps a team of threads for each thread that ran it;
    a kept team slows llama.cpp's barriers (`in_own_thread`). The loader runs on a thread of
    its own, gone when the load returns; what it raises reaches the caller."""
    threads = []

    def loader(record):
        threads.append(threading.current_thread())
        return load_version(record, cache_dir=MODEL_CACHE)

    versions = VersionManager(
        redis_client, base_model="tiny", model_cache=MODEL_CACHE, poll_s=60, loader=loader
    )
    versions.start()
    try:
        assert versions.serving()[CHAMPION] == "v0"
        assert len(threads) == 1
        assert threads[0] is not threading.current_thread()
        assert threads[0] is not versions._follower
        assert not threads[0].is_alive()
    finally:
        versions.stop()

    def broken():
        raise ValueError("no such checkpoint")

    with pytest.raises(ValueError, match="no such checkpoint"):
        in_own_thread(broken)
    assert in_own_thread(sum, [1, 2]) == 3
