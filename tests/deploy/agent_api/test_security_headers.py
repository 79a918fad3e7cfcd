"""The agent API's security headers (deploy/agent_api/security_headers.py) over real HTTP: on
every page and static file, on the JSON the pages fetch (the feedback fast path and the body
limit's 413 included), on the framework's docs; a header a route set itself is kept."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from deploy.agent_api.pages import PAGES, STATIC_DIR
from deploy.agent_api.security_headers import API_CSP, PAGE_CSP, SecurityHeaders
from tests.fakes.scripted_llm import Reply

STATIC = sorted(f"/static/{f.name}" for f in STATIC_DIR.iterdir() if f.is_file())
FRAMING_AND_SNIFFING = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
}


def csp(response: httpx.Response) -> dict[str, str]:
    """The response's Content-Security-Policy, directive name -> its sources."""
    directives = (
        d.strip().partition(" ") for d in response.headers["content-security-policy"].split(";")
    )
    return {name: sources for name, _, sources in directives}


def assert_secured(response: httpx.Response) -> None:
    """What every answer carries: framing, sniffing, Referer and other origins refused."""
    for name, value in FRAMING_AND_SNIFFING.items():
        assert response.headers.get(name) == value, (response.url, name)
    policy = csp(response)
    assert policy["frame-ancestors"] == "'none'", response.url
    assert policy["default-src"] == "'none'", response.url
    assert "strict-transport-security" not in response.headers  # plain HTTP: HSTS means nothing


def assert_page(response: httpx.Response) -> None:
    """A page or a file it loads: scripts and styles from this origin only, Trusted Types."""
    assert_secured(response)
    assert response.headers["cross-origin-opener-policy"] == "same-origin", response.url
    assert "camera=()" in response.headers["permissions-policy"]
    policy = csp(response)
    assert policy["script-src"] == policy["style-src"] == "'self'"  # no inline, no eval
    assert policy["require-trusted-types-for"] == "'script'"
    assert "cache-control" not in response.headers  # a page may be cached; the API's answers not


def assert_api(response: httpx.Response) -> None:
    """An API answer: nothing may load in it, and no cache keeps it."""
    assert_secured(response)
    assert response.headers["content-security-policy"] == API_CSP, response.url
    assert response.headers.get_list("cache-control") == ["no-store"], response.url


def test_every_page_and_static_file_refuses_framing_sniffing_and_inline_script(start_api):
    api = start_api()
    assert len(STATIC) >= 8 and "/static/chat.js" in STATIC
    for path in [*PAGES, *STATIC]:
        response = api.http.get(path)
        assert response.status_code == 200, path
        assert_page(response)
    home = api.http.get("/", follow_redirects=False)
    assert home.status_code == 307 and home.headers["location"] == "/chat"
    assert_page(home)
    missing = api.http.get("/static/nothing-here.js")
    assert missing.status_code == 404
    assert_page(missing)


def test_the_pages_html_has_no_inline_script_or_style():
    for file in PAGES.values():
        html = (STATIC_DIR / file).read_text()
        scripts = html.count("<script")  # every one a file of this origin (common.js and its own)
        assert scripts == html.count('<script src="/static/') >= 2, file
        assert "<style" not in html and not re.search(r"\s(style|on[a-z]+)\s*=", html, re.I), file


def test_the_json_the_pages_fetch_is_secured_and_never_cached(start_api, llm):
    api = start_api(max_body_bytes=4096)
    llm.push(Reply(content="5"))
    run = api.run("2+3?")
    assert run.status_code == 200
    body = run.json()
    # the chat page's feedback post: a well-formed one is answered by the fast path (ingest.py)
    thumbs = api.feedback(
        trajectory_id=body["trajectory_id"],
        feedback_token=body["feedback_token"],
        kind="thumbs",
        value=1,
    )
    assert thumbs.status_code == 202, thumbs.text
    refused = api.feedback(
        trajectory_id=body["trajectory_id"], feedback_token="not-a-token", kind="thumbs", value=1
    )
    assert refused.status_code in (400, 401, 403), refused.text
    too_large = api.http.post("/v1/feedback", content=b"x" * 5000)
    assert too_large.status_code == 413
    unknown_key = api.http.get("/v1/agents", headers={"Authorization": "Bearer nobody"})
    assert unknown_key.status_code == 401
    for response in (
        run,
        thumbs,
        refused,
        too_large,
        unknown_key,
        api.http.get("/v1/agents"),
        api.http.get("/v1/dashboard"),
        api.http.get("/v1/report-card"),
    ):
        assert_api(response)
    for response in (api.http.get("/healthz"), api.http.get("/metrics")):
        assert_page(response)


def test_a_stream_keeps_its_own_cache_header(start_api, llm):
    api = start_api()
    llm.push(Reply(content="5"))
    stream = api.http.post("/v1/agents/tutor/runs/stream", json={"input": "2+3?", "user_id": "u"})
    assert stream.status_code == 200 and "event: end" in stream.text
    assert stream.headers.get_list("cache-control") == ["no-cache"]
    assert_secured(stream)
    assert stream.headers["content-security-policy"] == API_CSP


def test_the_framework_docs_still_load_from_their_cdn_but_cannot_be_framed(start_api):
    api = start_api()
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = api.http.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"] == "frame-ancestors 'none'", path
        for name, value in FRAMING_AND_SNIFFING.items():
            assert response.headers[name] == value, (path, name)
        assert response.headers["cross-origin-opener-policy"] == "same-origin", path
    schema = api.http.get("/openapi.json")
    assert schema.status_code == 200
    assert_page(schema)


async def _answer(headers: list[tuple[bytes, bytes]], scheme: str, path: str) -> httpx.Response:
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    transport = httpx.ASGITransport(app=SecurityHeaders(app, docs=["/docs", None]))
    async with httpx.AsyncClient(transport=transport, base_url=f"{scheme}://testserver") as client:
        return await client.get(path)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_routes_own_header_wins_and_hsts_goes_on_https_only(scheme):
    own = [(b"content-type", b"application/json"), (b"X-Frame-Options", b"SAMEORIGIN")]
    response = asyncio.run(_answer(own, scheme, "/v1/anything"))
    assert response.headers.get_list("x-frame-options") == ["SAMEORIGIN"]
    assert response.headers["content-security-policy"] == API_CSP
    assert response.headers["cache-control"] == "no-store"
    page = asyncio.run(_answer([], scheme, "/chat"))
    assert page.headers["content-security-policy"] == PAGE_CSP
    assert (page.headers.get("strict-transport-security") is not None) == (scheme == "https")
    hsts = response.headers.get("strict-transport-security")
    assert hsts == ("max-age=31536000" if scheme == "https" else None)
    docs = asyncio.run(_answer([], scheme, "/docs"))
    assert docs.headers["content-security-policy"] == "frame-ancestors 'none'"
