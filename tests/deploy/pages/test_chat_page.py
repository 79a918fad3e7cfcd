"""The chat page in headless Chromium: a person picks an agent, asks, watches the answer stream
in, opens the tool calls, clicks thumbs-up, and the feedback is in Redis for that run."""

from __future__ import annotations

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, FeedbackEvent, decode
from agents.packs.medical import EMERGENCY
from agents.packs.medical import triage as triage_agent
from tests.fakes.api import API_KEY
from tests.fakes.scripted_llm import Reply

# Every value the answer's text took, recorded in the page as it changed.
WATCH = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const a = document.querySelector('.msg.assistant:last-child .answer');
    if (a && window.seen[window.seen.length - 1] !== a.textContent) window.seen.push(a.textContent);
  }).observe(document.getElementById('conversation'), {subtree: true, childList: true, characterData: true});
}"""


def open_chat(page, api):
    page.goto(f"{api.server.url}/chat")
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#agent option[value=tutor]", state="attached")


def events(redis_client, stream):
    return [decode(fields) for _, fields in redis_client.xrange(stream)]


def test_a_person_asks_sees_the_answer_stream_in_and_gives_a_thumbs_up(
    start_api, llm, page, redis_client, tmp_path
):
    api = start_api()
    llm.push(
        Reply(tool_calls=[("add", '{"a": 2, "b": 3}')]),
        Reply(content="Two plus three makes 5 apples", chunk_delay_s=0.05),
    )
    open_chat(page, api)
    page.evaluate(WATCH)
    page.fill("#input", "What is 2+3?")
    page.click("#send")
    answer = page.locator(".msg.assistant .answer")
    page.wait_for_selector(".msg.assistant .feedback .thumbs-up")
    assert answer.inner_text() == "Two plus three makes 5 apples"
    seen = page.evaluate("window.seen")
    assert seen[0] != seen[-1] and seen[-1] == "Two plus three makes 5 apples"
    assert "Two plus" in seen and all("Two plus three makes 5 apples".startswith(s) for s in seen)
    # the tool call is folded under the answer
    steps = page.locator(".msg.assistant details.steps")
    assert "(2)" in steps.locator("summary").inner_text()
    steps.locator("summary").click()
    assert (
        'calls add({"a": 2, "b": 3})' in steps.inner_text() and "tool add → 5" in steps.inner_text()
    )
    page.click(".msg.assistant .thumbs-up")
    page.wait_for_selector("text=Thanks: thumbs recorded.")
    page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'chat.png'}")

    [run] = events(redis_client, STREAM_TRAJECTORIES)
    [thumbs] = events(redis_client, STREAM_FEEDBACK)
    box = page.locator(".msg.assistant")
    assert box.get_attribute("data-trajectory-id") == run.trajectory_id
    assert isinstance(thumbs, FeedbackEvent)
    assert (thumbs.trajectory_id, thumbs.kind.value, thumbs.value, thumbs.agent) == (
        run.trajectory_id,
        "thumbs",
        1,
        "tutor",
    )
    assert thumbs.user_id == run.user_id == api.stored(page.evaluate("arloop.user()"))
    assert page.locator(".msg.assistant .thumbs-down").is_disabled()  # one judgement per answer


def test_the_medical_agent_shows_its_disclaimer_and_escalates_a_red_flag(
    start_api, llm, page, tmp_path
):
    api = start_api(specs=[triage_agent()])
    llm.push(
        Reply(tool_calls=[("kb_search", '{"query": "chest pain"}')]),
        Reply(content="Rest and see how it goes.\nTriage: self-care"),  # the model is wrong
    )
    llm.responder = lambda request: Reply(content="Rest at home.\nTriage: self-care")
    page.goto(f"{api.server.url}/chat")
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    page.wait_for_selector("#agent option[value=triage]", state="attached")
    assert "not medical advice" in page.inner_text("#agent-about")
    page.fill("#input", "I have crushing chest pain spreading to my arm")
    page.click("#send")
    page.wait_for_selector(".msg.assistant .feedback")
    assert page.inner_text(".msg.assistant .escalation") == EMERGENCY  # whatever the model said
    assert "not medical advice" in page.inner_text(".msg.assistant .disclaimer")
    page.screenshot(path=str(tmp_path / "chat-triage.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'chat-triage.png'}")
