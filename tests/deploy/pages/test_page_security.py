"""The pages under their security headers, in headless Chromium: another site cannot frame the
chat page; chat, dashboard and report card work with nothing refused by their CSP; answers,
tool calls, inputs and corrections that carry markup stay text; and markup a page did write
would have its inline script refused by the CSP."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.deploy.pages.test_chat_page import open_chat
from tests.deploy.pages.test_dashboard_page import demo_api, open_page, points
from tests.fakes.browser import watch_refusals
from tests.fakes.scripted_llm import Reply
from tests.fakes.servers import ServerThread

# Each payload sets window.__xss if a page ever runs it.
PAYLOAD = {
    "answer": '<img src="/x.png" onerror="window.__xss=\'answer\'"><script>window.__xss=1</script>',
    "input": "<img src=/x.png onerror=\"window.__xss='input'\"> what is 2+3?",
    "tool": "<svg onload=window.__xss='tool'>",
    "correction": "<img src=/x.png onerror=\"window.__xss='correction'\">",
}
WAIT_MS = 15_000  # an upper bound, never a pause: each wait ends when its event comes


def under_csp(page, path: str):
    """Wraps the page's navigation to `path`: its response must carry the pages' CSP."""
    return page.expect_response(
        lambda r: urlsplit(r.url).path == path and r.request.is_navigation_request()
    )


def assert_csp(response) -> None:
    assert "frame-ancestors 'none'" in response.headers.get("content-security-policy", "")
    assert "require-trusted-types-for 'script'" in response.headers["content-security-policy"]


def attacker_site(target: str) -> ServerThread:
    """A second loopback server, another origin (`localhost`, its own port): a page that frames
    `target` and marks its body once the frame has loaded, whatever the frame holds."""
    html = (
        "<!doctype html><title>prize</title><p>Click to win</p>"
        f'<iframe id="victim" src="{target}" width="800" height="600" '
        "onload=\"document.body.dataset.framed = 'loaded'\"></iframe>"
    )
    site = ServerThread(Starlette(routes=[Route("/", lambda _: HTMLResponse(html))]))
    site.url = site.url.replace("127.0.0.1", "localhost")
    return site


def test_another_site_cannot_frame_the_chat_page(start_api, page):
    api = start_api()
    open_chat(page, api)  # the browser holds a key for the API's origin, as a user's would
    with attacker_site(f"{api.server.url}/chat") as site:
        with page.expect_console_message(
            lambda m: "frame-ancestors 'none'" in m.text, timeout=WAIT_MS
        ) as refusal:
            page.goto(f"{site.url}/")
            page.wait_for_selector("body[data-framed=loaded]", state="attached", timeout=WAIT_MS)
        assert "blocked" in refusal.value.text
        [frame] = [f for f in page.frames if f.parent_frame is page.main_frame]
        assert not frame.url.startswith(api.server.url)  # Chromium's error page, not /chat
        assert frame.query_selector("#api-key") is None and frame.query_selector("#ask") is None
        assert page.inner_text("p") == "Click to win"  # the attacker's own page still loads


def test_the_chat_page_works_under_its_csp_and_writes_markup_as_text(start_api, llm, page):
    api = start_api()
    llm.push(
        Reply(tool_calls=[("add", json.dumps({"a": 2, "b": 3, "note": PAYLOAD["tool"]}))]),
        Reply(content=PAYLOAD["answer"], chunk_delay_s=0.01),
    )
    refused = watch_refusals(page)
    with under_csp(page, "/chat") as chat:
        open_chat(page, api)
    assert_csp(chat.value)
    page.fill("#input", PAYLOAD["input"])
    page.click("#send")
    page.wait_for_selector(".msg.assistant .feedback .thumbs-up", timeout=WAIT_MS)
    page.click(".msg.assistant .thumbs-up")
    page.wait_for_selector("text=Thanks: thumbs recorded.", timeout=WAIT_MS)
    page.click(".msg.assistant details.correction summary")
    page.fill(".msg.assistant details.correction textarea", PAYLOAD["correction"])
    page.click("text=Send correction")
    page.wait_for_selector("text=Thanks: correction recorded.", timeout=WAIT_MS)
    page.click(".msg.assistant details.steps summary")

    assert page.inner_text(".msg.user") == PAYLOAD["input"]
    assert page.text_content(".msg.assistant .answer") == PAYLOAD["answer"]
    assert PAYLOAD["tool"] in page.inner_text(".msg.assistant details.steps")
    conversation = "#conversation :is(img, script, svg, iframe, object, embed)"
    assert page.query_selector_all(conversation) == []  # no element made from a payload
    assert page.evaluate("window.__xss") is None
    assert refused() == []


def test_markup_a_page_did_write_would_have_its_inline_script_refused(start_api, page):
    api = start_api()
    refused = watch_refusals(page)
    open_chat(page, api)
    # Trusted Types first: a string is refused as markup outright
    error = page.evaluate(
        """() => { try { document.getElementById("status").innerHTML = "<b>hi</b>"; return null; }
                   catch (e) { return e.constructor.name + ": " + e.message; } }"""
    )
    assert error is not None and error.startswith("TypeError") and "TrustedHTML" in error
    # markup through the one allowed policy (not made on this page): the CSP still refuses
    # its inline handler; the image's own error listener runs after the handler would have
    ran = page.evaluate(
        """async () => {
             const policy = trustedTypes.createPolicy("arloop-svg", { createHTML: (s) => s });
             const box = document.createElement("div");
             box.innerHTML = policy.createHTML('<img src="/x.png" onerror="window.__xss = 1">');
             document.body.append(box);
             await new Promise((done) => box.querySelector("img").addEventListener("error", done));
             return window.__xss;
           }"""
    )
    assert ran is None
    page.wait_for_function(
        "() => window.__refused.some((r) => r.startsWith('script-src'))", timeout=WAIT_MS
    )
    assert any("TrustedHTML" in r or "trusted" in r.lower() for r in refused())


def test_the_dashboard_and_report_card_render_under_their_csp(start_api, page):
    api = start_api()
    refused = watch_refusals(page)
    with under_csp(page, "/dashboard") as dashboard:
        open_page(page, api, "/dashboard?refresh=60")
    assert_csp(dashboard.value)
    page.wait_for_selector("body[data-loaded]", state="attached", timeout=WAIT_MS)
    assert page.locator("figure[data-chart] svg.chart").count() == 8  # 2 + 6 round
    assert refused() == []
    with under_csp(page, "/report-card") as card:
        open_page(page, api, "/report-card")
    assert_csp(card.value)
    page.wait_for_selector("#card tr", state="attached", timeout=WAIT_MS)
    assert "updated" in page.inner_text("#status")
    assert refused() == []


def test_the_dashboard_charts_a_real_quick_demo_under_its_csp(start_api, page, quick_demo):
    api = demo_api(start_api, quick_demo[2])
    refused = watch_refusals(page)
    with under_csp(page, "/dashboard") as dashboard:
        open_page(page, api, "/dashboard?refresh=60")
    assert_csp(dashboard.value)
    page.wait_for_selector('figure[data-chart="reward"] circle.point', timeout=WAIT_MS)
    assert set(points(page, "held_out")) == {"v0", "v1"}
    assert refused() == []
