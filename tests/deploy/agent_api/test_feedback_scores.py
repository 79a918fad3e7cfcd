"""Named scores on `POST /v1/feedback` (`key`, `score`, `comment`, as LangSmith and Langfuse
take feedback) over real HTTP and Redis: read as rewards by the pack's rule, PHI-scrubbed,
one per key and trajectory, and hostile values refused with a 4xx before anything is written."""

from __future__ import annotations

import pytest

from agents.events import STREAM_FEEDBACK, FeedbackKind, decode
from agents.packs.base import Pack, default_score_reward
from learner.rewards import episode_reward, scored
from tests.fakes.api import api_specs
from tests.fakes.scripted_llm import Reply

FEEDBACK = b'{"trajectory_id": "t", "feedback_token": "x", '


def stars(key: str, score: float) -> float | None:
    """A team's rule: `stars` 1..5 around 3, `nonsense` returns what no reward may be."""
    if key == "stars":
        return (score - 3.0) / 2.0
    if key == "nonsense":
        return float("nan") if score < 0 else 7.0
    return None


def stars_pack() -> Pack:
    return Pack("stars", tuple(api_specs()), lambda split: [], lambda t, a: 0.0, score_reward=stars)


def _events(redis_client):
    return [decode(fields) for _, fields in redis_client.xrange(STREAM_FEEDBACK)]


def _run(api, llm):
    llm.responder = lambda request: Reply(content="Four.")
    body = api.run("2+2?").json()
    return body["trajectory_id"], body["feedback_token"]


def test_the_default_rule_reads_a_score_in_0_1_and_keeps_the_comment_scrubbed(
    start_api, llm, redis_client
):
    api = start_api(scrubber=lambda text: text.replace("555-0100", "<PHONE>"))
    trajectory, token = _run(api, llm)
    reply = api.feedback(
        trajectory_id=trajectory,
        feedback_token=token,
        key="helpfulness",
        score=0.75,
        comment="call me at 555-0100",
    )
    assert reply.status_code == 202, reply.text
    (event,) = _events(redis_client)
    assert (event.kind, event.key, event.value) == (FeedbackKind.SCORE, "helpfulness", 0.75)
    assert event.text == "call me at <PHONE>"  # scrubbed before Redis
    assert event.reward == default_score_reward("helpfulness", 0.75) == 0.5
    again = api.feedback(trajectory_id=trajectory, feedback_token=token, key="helpfulness", score=1)
    assert again.status_code == 409 and "score:helpfulness" in again.json()["detail"]
    other = api.feedback(
        trajectory_id=trajectory, feedback_token=token, kind="score", key="tone", score=40
    )
    assert other.status_code == 202  # another key is another score
    assert _events(redis_client)[-1].reward is None  # 40 is on no scale the default reads
    thumbs = api.feedback(trajectory_id=trajectory, feedback_token=token, kind="thumbs", value=1)
    assert thumbs.status_code == 202  # the four kinds are untouched
    listed = api.http.get("/v1/feedback").json()["items"]
    assert [(i["kind"], i["key"]) for i in listed][:2] == [
        ("score", "helpfulness"),
        ("score", "tone"),
    ]


def test_the_packs_rule_maps_named_scores_to_rewards_the_learner_reads(
    start_api, llm, redis_client
):
    api = start_api(specs=None, packs=[f"{__name__}:stars_pack"])
    trajectory, token = _run(api, llm)
    for key, score in (("stars", 5), ("nonsense", 1.0)):
        reply = api.feedback(trajectory_id=trajectory, feedback_token=token, key=key, score=score)
        assert reply.status_code == 202, reply.text
    second, token2 = _run(api, llm)
    api.feedback(trajectory_id=second, feedback_token=token2, key="nonsense", score=-1)
    stars_event, clamped, nan = _events(redis_client)
    assert stars_event.reward == 1.0  # (5 - 3) / 2, the pack's own reading
    assert clamped.reward == 1.0  # the rule said 7: a reward stays within [-1, 1]
    assert nan.reward is None  # the rule said NaN: not learned from
    rewards = episode_reward(scored([stars_event, clamped]), [0])
    assert rewards.reward == 1.0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'"key": "stars", "score": NaN}', "finite number"),
        (b'"key": "stars", "score": Infinity}', "finite number"),
        (b'"key": "stars", "score": 1e99999999}', "finite number"),
        (b'"key": "stars", "score": 1e300}', "less than or equal"),
        (b'"key": "' + b"k" * 65 + b'", "score": 1}', "at most 64"),
        (b'"key": "no spaces", "score": 1}', "pattern"),
        (b'"key": "stars", "score": 1, "comment": "' + b"c" * 8001 + b'"}', "at most 8000"),
        (b'"key": "stars", "score": 1, "value": 1}', "not both"),
        (b'"key": "stars", "score": 1, "text": "a", "comment": "b"}', "not both"),
        (b'"score": 1}', "kind is required"),
        (b'"key": "stars", "score": 1, "comment": "\\ud800"}', "unicode"),
    ],
)
def test_hostile_named_scores_are_a_4xx_with_a_reason(start_api, llm, redis_client, body, reason):
    api = start_api()
    reply = api.http.post(
        "/v1/feedback", content=FEEDBACK + body, headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    text = detail if isinstance(detail, str) else " ".join(e["msg"] for e in detail)
    assert reason.lower() in text.lower()
    assert redis_client.xlen(STREAM_FEEDBACK) == 0


def test_a_key_on_another_kind_or_a_score_without_a_key_is_refused(start_api, llm, redis_client):
    api = start_api()
    trajectory, token = _run(api, llm)
    keyed = api.feedback(
        trajectory_id=trajectory, feedback_token=token, kind="thumbs", value=1, key="stars"
    )
    assert keyed.status_code == 422 and "thumbs feedback takes `value`" in str(keyed.json())
    scored = api.feedback(trajectory_id=trajectory, feedback_token=token, kind="rating", score=4)
    assert scored.status_code == 422 and "make a named score" in str(scored.json())
    keyless = api.feedback(trajectory_id=trajectory, feedback_token=token, kind="score", score=1)
    assert keyless.status_code == 422 and "needs a key" in keyless.json()["detail"]
    assert redis_client.xlen(STREAM_FEEDBACK) == 0
