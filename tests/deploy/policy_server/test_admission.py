"""Admission control over real HTTP, both engines: a queue bounded in tokens and in time (503
with Retry-After beyond it), generation cancelled when its client leaves, a bounded shutdown.

The engine's forward passes go through a gate the test opens pass by pass (`Gate`), so what
runs, what waits and what was cancelled is decided by the test, not by the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from deploy.embedded_redis import free_port
from learner.policy.models import load_base, load_version
from tests.deploy.policy_server.support import ENGINES, serving, tiny_settings
from tests.model_cache import MODEL_CACHE

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def no_end() -> dict[str, float]:
    """A logit_bias that keeps the tiny model from ending a row (every special token)."""
    _, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    return {str(i): -100.0 for i in tokenizer.all_special_ids}


class Gate:
    """Holds each forward pass of the engine until the test lets it through; records the rows
    (sequences) of each pass."""

    def __init__(self) -> None:
        self.passes: list[int] = []
        self._permits, self._open = 0, False
        self._cond = threading.Condition()

    def enter(self, rows: int) -> None:
        """On the engine's thread, before a forward pass."""
        with self._cond:
            self.passes.append(rows)
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._open or self._permits > 0, timeout=120):
                raise RuntimeError("the test never let this forward pass through")
            if not self._open:
                self._permits -= 1

    def allow(self, passes: int = 1) -> None:
        with self._cond:
            self._permits += passes
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def wait_entered(self, count: int) -> None:
        """Until `count` passes have begun (the last one is held unless the gate is open)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.passes) >= count, timeout=60):
                raise AssertionError(f"the engine began {len(self.passes)} passes, not {count}")


class _GatedModel:
    """A transformers model whose calls (forward passes) wait at the gate."""

    def __init__(self, model, gate: Gate) -> None:
        self._model, self._gate = model, gate

    def __call__(self, *args, **kwargs):
        self._gate.enter(int(kwargs["input_ids"].shape[0]))
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class _GatedRunner:
    """A llama.cpp runner whose `decode` calls wait at the gate."""

    def __init__(self, runner, gate: Gate) -> None:
        self._runner, self._gate = runner, gate

    def decode(self, feeds):
        self._gate.enter(len(feeds))
        return self._runner.decode(feeds)

    def __getattr__(self, name: str):
        return getattr(self._runner, name)


def _gated_loader(settings, gate: Gate):
    """The engine's own loader, its model wrapped so that each forward pass waits at `gate`."""
    if settings.policy_engine == "llamacpp":
        from deploy.policy_server.llamacpp.loader import LlamaLoader

        inner = LlamaLoader(
            cache_dir=MODEL_CACHE, quant=settings.llamacpp_quant, slots=settings.max_batch_size,
            threads=1, context=settings.context_length,
        )  # fmt: skip
        wrap = _GatedRunner
    else:

        def inner(record):
            return load_version(record, cache_dir=MODEL_CACHE)

        wrap = _GatedModel

    def load(record):
        model, tokenizer = inner(record)
        return wrap(model, gate), tokenizer

    return load


@contextmanager
def gated(redis_url: str, engine: str, **overrides) -> Iterator[tuple[str, Gate, object, object]]:
    """A tiny-model server whose engine waits at a gate: (base URL, gate, server, thread)."""
    gate = Gate()
    values = {
        "policy_engine": engine,
        "max_batch_size": 2,
        "prefix_cache": 0,
        "max_tokens_cap": 400,
    }
    settings = tiny_settings(redis_url, **(values | overrides))
    with serving(settings, loader=_gated_loader(settings, gate)) as (base, server, thread):
        try:
            yield base, gate, server, thread
        finally:
            gate.open()  # whatever the test did, let the engine finish so the server can stop


def _body(n: int, max_tokens: int, **extra) -> dict:
    return {"model": "arloop", "messages": HI, "n": n, "max_tokens": max_tokens, **extra}


def _post(base: str, body: dict, timeout: float = 60, **kw) -> httpx.Response:
    return httpx.post(f"{base}/chat/completions", json=body, timeout=timeout, **kw)


def _health(base: str) -> dict:
    r = httpx.get(base.removesuffix("/v1") + "/healthz", timeout=10)
    assert r.status_code == 200, r.text  # answers while the engine is held mid-pass
    return r.json()


def _queue(base: str) -> dict:
    return _health(base).get("admission", {})


def _metric(base: str, line: str) -> float:
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
    for ln in text.splitlines():
        if ln.startswith(line + " "):
            return float(ln.split()[-1])
    return 0.0


def _wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _raw(base: str, body: dict) -> socket.socket:
    """A POST written on a socket of our own, so that the test decides when the client leaves."""
    host, port = base.removeprefix("http://").removesuffix("/v1").split(":")
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _refusal(r: httpx.Response, code: str) -> None:
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == "server_error", error
    assert int(r.headers["Retry-After"]) >= 1


def test_a_request_beyond_the_queue_is_a_503_that_costs_no_budget(redis_url, engine, no_end):
    overrides = {"policy_queue_tokens": 400, "key_tokens_per_minute": 700}
    with gated(redis_url, engine, **overrides) as (base, gate, _, _), ThreadPoolExecutor(2) as pool:
        a = pool.submit(_post, base, _body(2, 50, logit_bias=no_end))  # both rows of the engine
        gate.wait_entered(1)
        b = pool.submit(_post, base, _body(1, 100))  # 100 + its prompt: fits the 400 queued
        _wait_for(lambda: _queue(base).get("queued") == 1, "the second request to be queued")
        # 300 + its prompt would fit the queue alone, not beside the one waiting
        c = _post(base, _body(1, 300))
        _refusal(c, "queue_full")
        assert "ARLOOP_POLICY_QUEUE_TOKENS" in c.json()["error"]["message"]
        assert not a.done() and not b.done()
        gate.open()
        assert a.result().status_code == 200 and b.result().status_code == 200
        # the refused 300 went back to the key's 700 a minute: 100 + 100 + 300 fit
        assert _post(base, _body(1, 300)).status_code == 200
        assert _queue(base) == {
            "running_rows": 0, "queued": 0, "queued_tokens": 0, "shutting_down": False,
        }  # fmt: skip
        assert _metric(base, 'arloop_policy_refused_total{reason="queue_full"}') == 1


def test_a_request_that_waits_past_the_bound_is_a_503(redis_url, engine, no_end):
    with gated(redis_url, engine, policy_queue_wait_s=1.0) as (base, gate, _, _):
        with ThreadPoolExecutor(1) as pool:
            a = pool.submit(_post, base, _body(2, 50, logit_bias=no_end))
            gate.wait_entered(1)  # held mid-pass: nothing frees a slot until the gate opens
            b = _post(base, _body(1, 4), timeout=30)
            _refusal(b, "queue_timeout")
            assert b.headers["Retry-After"] == "1"
            assert _queue(base)["queued"] == 0
            gate.open()
            assert a.result().status_code == 200


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_client_that_leaves_stops_its_generation_and_frees_its_slot(
    redis_url, engine, stream, no_end
):
    with gated(redis_url, engine) as (base, gate, _, _):
        body = _body(2, 400, temperature=0, logit_bias=no_end, stream=stream)
        client = _raw(base, body)
        gate.wait_entered(1)
        gate.allow(2)
        gate.wait_entered(3)  # two tokens made (or prompts fed), the third pass held
        if stream:
            assert b"data: " in client.recv(65536), "the stream's first chunk"
        client.close()
        _wait_for(
            lambda: _metric(base, 'arloop_policy_cancelled_total{reason="client_gone"}') == 1,
            "the server to notice the client left",
        )
        held = len(gate.passes)
        gate.allow(1)  # the pass under way ends; its rows are not decoded again
        gate.open()
        # both of the engine's rows were the departed request's: this one runs only if freed
        r = _post(base, _body(1, 2, temperature=0), timeout=30)
        assert r.status_code == 200, r.text
        after = gate.passes[held:]
        assert after and all(rows == 1 for rows in after), (
            f"passes after the client left decoded {after} rows (1: the new request alone)"
        )
        assert _queue(base)["running_rows"] == 0


def test_a_client_that_leaves_the_queue_frees_its_place(redis_url, engine, no_end):
    with gated(redis_url, engine) as (base, gate, _, _), ThreadPoolExecutor(1) as pool:
        a = pool.submit(_post, base, _body(2, 20, logit_bias=no_end))
        gate.wait_entered(1)
        waiting = _raw(base, _body(1, 100, stream=True))
        _wait_for(lambda: _queue(base).get("queued") == 1, "the stream to be queued")
        assert _queue(base)["queued_tokens"] > 100
        waiting.close()
        _wait_for(lambda: _queue(base)["queued"] == 0, "the stream's place to be freed")
        assert _queue(base)["queued_tokens"] == 0 and len(gate.passes) == 1
        gate.open()
        assert a.result().status_code == 200


def _stream_lines(base: str, body: dict) -> list[str]:
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=30) as r:
        return [ln for ln in r.iter_lines() if ln.startswith("data: ")]


def test_shutdown_refuses_the_queue_then_cuts_generation_at_the_grace(redis_url, engine, no_end):
    settings = {"max_batch_size": 4, "policy_shutdown_grace_s": 1.0}
    with gated(redis_url, engine, **settings) as (base, gate, server, thread):
        with ThreadPoolExecutor(3) as pool:
            plain = pool.submit(_post, base, _body(2, 400, logit_bias=no_end), 30)
            gate.wait_entered(1)
            stream = pool.submit(_stream_lines, base, _body(2, 400, logit_bias=no_end, stream=True))
            _wait_for(lambda: _queue(base).get("running_rows") == 4, "both to be admitted")
            queued = pool.submit(_post, base, _body(1, 4), 30)
            _wait_for(lambda: _queue(base).get("queued") == 1, "the third to be queued")
            server.should_exit = True  # what uvicorn's SIGTERM handler does
            _refusal(_result(queued, "the queued request"), "shutting_down")
            _refusal(_result(plain, "the generating request"), "shutting_down")
            last = json.loads(_result(stream, "the stream").pop().removeprefix("data: "))
            assert last["error"]["code"] == "shutting_down", last
            gate.open()  # the pass held since the start ends; the engine has nothing left
            thread.join(timeout=30)
            assert not thread.is_alive(), "the server did not stop"


def _result(future: Future, what: str):
    try:
        return future.result(timeout=30)
    except httpx.TimeoutException:
        raise AssertionError(f"{what} got no answer after shutdown began") from None


def test_sigterm_under_load_exits_within_the_grace(redis_url, tmp_path, no_end):
    """The process as `arloop serve policy` runs it, overloaded, then SIGTERM: it exits within
    its grace and a few seconds, every client answered (none left hanging)."""
    port = free_port()
    env = {
        **os.environ,
        "ARLOOP_REDIS_URL": redis_url,
        "ARLOOP_BASE_MODEL": "tiny",
        "ARLOOP_POLICY_PORT": str(port),
        "ARLOOP_POLICY_ENGINE": "transformers",
        "ARLOOP_DATA_DIR": str(tmp_path),
        "ARLOOP_THREADS": "1",
        "ARLOOP_RELOAD_POLL_S": "0.5",
        "ARLOOP_POLICY_SHUTDOWN_GRACE_S": "2",
        "ARLOOP_POLICY_QUEUE_TOKENS": "65536",
        "ARLOOP_LOG_LEVEL": "WARNING",
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.policy_server.app"], env=env, stderr=err
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_for(lambda: _up(base, proc), "the server to start", timeout=120)
        # 64 x 16 x 400 tokens: far more than the grace lets it make (the tiny model makes
        # about 10,000 tokens/s on one core)
        body = _body(16, 400, logit_bias=no_end)
        with ThreadPoolExecutor(64) as pool:
            answers = [pool.submit(_outcome, base, body) for _ in range(64)]
            _wait_for(lambda: _metric(base, "arloop_policy_batch_rows_count") > 0, "decoding")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError("still alive 30 s after SIGTERM") from None
            seconds = time.monotonic() - started
            outcomes = [a.result() for a in answers]
        assert seconds < 2 + 8, f"exited {seconds:.1f} s after SIGTERM (grace 2 s)"
        assert "timeout" not in outcomes, outcomes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _up(base: str, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        raise AssertionError("the policy server exited at start")
    try:
        return httpx.get(base.removesuffix("/v1") + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _outcome(base: str, body: dict) -> int | str:
    """The status a client got, or what happened instead."""
    try:
        return _post(base, body, timeout=40).status_code
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError as exc:
        return type(exc).__name__


def test_requests_are_admitted_in_order_and_a_large_one_alone():
    """A request with more choices than the batch waits for the engine to empty and runs
    alone; one behind it is not let past it (nothing starves); finished rows free their slots."""
    from deploy.policy_server.admission import Admission
    from deploy.policy_server.metrics import PolicyMetrics

    async def scenario() -> list[str]:
        admission = Admission(
            slots=4, queue_tokens=1000, queue_wait_s=30, grace_s=1, metrics=PolicyMetrics()
        )
        order: list[str] = []

        async def request(name: str, rows: int):
            ticket = await admission.enter(rows, 10)
            order.append(name)
            return ticket

        small = await request("small", 2)
        large = asyncio.ensure_future(request("large", 6))
        after = asyncio.ensure_future(request("after", 1))  # would fit beside "small"
        await asyncio.sleep(0)
        assert order == ["small"] and admission.state()["queued"] == 2
        admission.row_done(small)
        admission.row_done(small)  # the engine is empty: "large" starts, alone
        big = await large
        await asyncio.sleep(0)
        assert order == ["small", "large"] and admission.state()["running_rows"] == 6
        admission.leave(small)
        admission.leave(big)
        await after
        assert admission.state() == {
            "running_rows": 1, "queued": 0, "queued_tokens": 0, "shutting_down": False,
        }  # fmt: skip
        return order

    assert asyncio.run(scenario()) == ["small", "large", "after"]
