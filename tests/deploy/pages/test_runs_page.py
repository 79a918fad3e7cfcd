"""The runs view and the review queue in headless Chromium: browse and open a run, then a
reviewer judges a fallback answer from the queue and the verdict lands in the feedback stream."""

from __future__ import annotations

import os

from agents.events import STREAM_FEEDBACK, FeedbackKind, decode
from tests.deploy.agent_api.test_review import REVIEWER_KEY, keys
from tests.deploy.agent_api.test_runs_view import FALLBACK, guarded_specs, seed
from tests.fakes.browser import watch_refusals

WAIT_MS = 15_000
SHOTS = os.environ.get("ARLOOP_PAGE_SHOTS")
"""A folder to save the pages' screenshots in (for the docs and reviews); unset: none."""


def open_with_key(page, api, path: str, key: str) -> None:
    page.goto(f"{api.server.url}{path}")
    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")


def shot(page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def test_browse_runs_open_one_and_review_from_the_queue(start_api, llm, page, redis_client):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    runs = seed(api, llm)
    refused = watch_refusals(page)

    # the runs view: every run, newest first; filtered to the fallback answers
    open_with_key(page, api, "/runs", REVIEWER_KEY)
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 5")
    rows = page.locator("#runs tr.run-row")
    assert rows.first.get_attribute("data-trajectory") == runs["alice"]["trajectory_id"]
    tool = page.locator(f'#runs tr[data-trajectory="{runs["tool"]["trajectory_id"]}"]')
    assert "thumbs up 1" in tool.inner_text()
    shot(page, "runs")
    page.select_option("#f-answered-by", "fallback")
    page.click("#f-apply")
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 1")
    fallback_id = runs["fallback"]["trajectory_id"]
    assert rows.first.get_attribute("data-trajectory") == fallback_id

    # open it: the answer returned, the guard's verdict, the model's own answer, its steps
    rows.first.click()
    page.wait_for_selector("#run:not([hidden]) #steps")
    assert page.inner_text("#run-output") == FALLBACK
    guard = page.inner_text("#guard")
    assert "Answered by: fallback" in guard and "I am unsure" in guard
    assert "reason: unsure" in guard
    assert page.locator("#steps li.step").count() == 1
    assert page.inner_text("#run-feedback") == "No feedback yet."
    shot(page, "run")
    # a run with a tool call shows the call the model asked for and the tool's result
    page.select_option("#f-answered-by", "")
    page.select_option("#f-feedback", "thumbs_up")
    page.click("#f-apply")
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 1")
    rows.first.click()
    page.wait_for_selector("#steps li.step.tool")
    assert [
        k
        for k in page.locator("#steps li.step").evaluate_all(
            "items => items.map((i) => i.dataset.kind)"
        )
    ] == ["model", "tool", "model"]
    assert 'add({"a": 2, "b": 3})' in page.inner_text("#steps li.step.model >> nth=0")
    assert page.locator("#run-feedback tr[data-kind=thumbs]").count() == 1

    # the queue: the fallback answer is waiting; the reviewer says it was wrong, and why
    open_with_key(page, api, "/review", REVIEWER_KEY)
    page.fill("#f-sample", "0")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#queue tr.run-row').length === 1")
    item = page.locator("#queue tr.run-row").first
    assert item.get_attribute("data-trajectory") == fallback_id
    assert "fallback" in item.inner_text()
    item.click()
    page.wait_for_selector("#verdict-panel:not([hidden])")
    assert "Answered by: fallback" in page.inner_text("#guard")
    page.check("#verdict input[name=score][value='0.5']")
    page.fill("#verdict-text", "18")
    shot(page, "review")
    page.click("#verdict-submit")
    page.wait_for_selector("#status[data-recorded]")
    assert "Review recorded" in page.inner_text("#status")
    assert page.locator("#queue tr.run-row").count() == 0
    assert page.locator("#verdict-panel").is_hidden()
    shot(page, "reviewed")

    [review] = [
        e
        for e in (decode(f) for _, f in redis_client.xrange(STREAM_FEEDBACK))
        if e.kind is FeedbackKind.REVIEW
    ]
    assert review.event_id == page.get_attribute("#status", "data-recorded")
    assert (review.trajectory_id, review.value, review.text) == (fallback_id, 0.5, "18")
    assert (review.source, review.user_id) == ("review", api.stored("dr-lee"))
    # the queue stays empty on a reload; the runs view marks the run reviewed
    page.reload()
    page.wait_for_selector("body[data-loaded]", state="attached")
    page.fill("#f-sample", "0")
    page.click("#filters button[type=submit]")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('0 runs')")
    assert refused() == []


def test_a_plain_users_key_is_told_the_queue_takes_a_reviewer(start_api, llm, page):
    from tests.deploy.agent_api.test_runs_view import USER_KEY

    api = start_api(specs=guarded_specs(), api_keys=keys())
    seed(api, llm)
    open_with_key(page, api, "/review", USER_KEY)
    page.wait_for_function("() => document.getElementById('status').textContent.includes('403')")
    assert "'review' scope" in page.inner_text("#status")
    assert page.locator("#status.error").count() == 1
    open_with_key(page, api, "/runs", USER_KEY)  # a user's key browses its own runs only
    page.wait_for_function("() => document.querySelectorAll('#runs tr.run-row').length === 1")
