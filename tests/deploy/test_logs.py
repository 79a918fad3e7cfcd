"""deploy/logs.py: JSON lines with process, trace and version, from a request and from the gate."""

from __future__ import annotations

import asyncio
import logging

import httpx

from deploy.logs import bind, log_context
from tests.deploy.policy_server.support import running_server, tiny_settings
from tests.fakes.logs import captured_logs
from tests.fakes.scripted_llm import Reply

QUIET_UVICORN = {"log_config": None, "log_level": "warning"}  # logging left to setup_logging


def test_a_line_carries_process_and_the_bound_trace_and_version():
    log = logging.getLogger("arloop.test")
    with captured_logs("learner") as logs:
        log.info("before")
        with log_context(trace="traj_1", version="v3"):
            log.warning("gating %s", "v3")
        log.info("after")
    before, inside, after = logs.records()
    assert inside["message"] == "gating v3" and inside["level"] == "WARNING"
    assert (inside["process"], inside["trace"], inside["version"]) == ("learner", "traj_1", "v3")
    assert inside["logger"] == "arloop.test" and inside["timestamp"].endswith("+00:00")
    assert "trace" not in before and "version" not in after and after["process"] == "learner"


def test_text_format_is_one_plain_line():
    with captured_logs("policy_server", "text") as logs:
        logging.getLogger("arloop.test").info("loaded %s", "v2")
    assert logs.text().rstrip().endswith("INFO policy_server arloop.test: loaded v2")


def test_a_run_logs_one_json_line_with_its_trajectory_and_version(start_api, llm):
    llm.responder = lambda request: Reply(content="ok")
    secret = "my chest hurts since Tuesday"
    with captured_logs("agent_api") as logs:
        api = start_api(server=QUIET_UVICORN)
        body = api.run(secret).json()
    runs = [r for r in logs.records() if r["logger"] == "deploy.agent_api.app"]
    assert len(runs) == 1, logs.text()
    assert runs[0]["process"] == "agent_api" and "tutor" in runs[0]["message"]
    assert (runs[0]["trace"], runs[0]["version"]) == (body["trajectory_id"], body["policy_version"])
    assert secret not in logs.text()  # user text never reaches a log line


def test_uvicorn_access_lines_of_the_policy_server_carry_request_id_and_version(redis_url):
    settings = tiny_settings(redis_url)
    options = QUIET_UVICORN | {"log_level": "info"}
    with captured_logs("policy_server") as logs:
        with running_server(settings, uvicorn_options=options) as base:
            chat = {"model": "arloop", "messages": [{"role": "user", "content": "hi"}]}
            reply = httpx.post(f"{base}/chat/completions", json=chat, timeout=60).json()
            missing = httpx.post(f"{base}/chat/completions", json=chat | {"model": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    access = [r for r in logs.records() if r["logger"] == "uvicorn.access"]
    served, refused = access
    assert "POST /v1/chat/completions" in served["message"] and served["process"] == "policy_server"
    assert (served["trace"], served["version"]) == (reply["id"], reply["system_fingerprint"])
    assert refused["trace"].startswith("chatcmpl-") and "version" not in refused
    assert any(r["logger"] == "uvicorn.error" for r in logs.records())  # startup lines too


def test_concurrent_requests_keep_their_own_trace():
    log = logging.getLogger("arloop.test")

    async def request(n: int) -> None:  # uvicorn runs each request as its own task
        bind(trace=f"req_{n}", version=f"v{n}")
        await asyncio.sleep(0)  # the other request binds in between
        log.info("answered")

    async def both() -> None:
        await asyncio.gather(request(1), request(2))

    with captured_logs("agent_api") as logs:
        asyncio.run(both())
        log.info("outside")
    lines = logs.records()
    assert [(r["trace"], r["version"]) for r in lines[:2]] == [("req_1", "v1"), ("req_2", "v2")]
    assert "trace" not in lines[2]
