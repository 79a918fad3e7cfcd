"""The feedback intake against a real Redis: the event and its replay marker land together or
not at all, whatever Redis refuses; a retried call is not a duplicate; the error is the real one."""

from __future__ import annotations

import time

import pytest

from agents.events import FEEDBACK_SEEN_PREFIX, STREAM_FEEDBACK
from agents.feedback_intake import (
    _ACCEPT,
    FeedbackIntake,
    FeedbackRejected,
    FeedbackSubmission,
    feedback_event_id,
)
from agents.feedback_tokens import TokenClaims, issue, sign
from tests.fakes.fixtures import aredis  # noqa: F401

SECRET = "s" * 40


def rating(token: str, trajectory: str = "traj_1") -> FeedbackSubmission:
    return FeedbackSubmission(trajectory, token, "rating", 5.0, user_id="u1")


def markers(redis_client) -> list[bytes]:
    return list(redis_client.scan_iter(f"{FEEDBACK_SEEN_PREFIX}:*"))


@pytest.fixture
def intake(aredis) -> FeedbackIntake:  # noqa: F811
    return FeedbackIntake(aredis, SECRET, rate_per_minute=60)


async def test_a_token_expiring_beyond_any_issued_life_is_refused_before_any_write(
    intake, redis_client
):
    """Such an expiry made `SET ... EX` fail after the XADD: an event without its marker
    (answered 503 "Redis is unavailable"), and a retry wrote it again."""
    far = TokenClaims("traj_1", "u1", "v0", int(time.time()) + 10**12)
    for _ in range(2):  # the retry is refused alike
        with pytest.raises(FeedbackRejected) as caught:
            await intake.accept(rating(sign(SECRET, far)))
        assert caught.value.status == 401 and "longest token life" in caught.value.reason
    assert redis_client.xlen(STREAM_FEEDBACK) == 0 and markers(redis_client) == []


async def test_a_failed_xadd_takes_its_marker_back_and_a_retry_lands_once(intake, redis_client):
    redis_client.set(STREAM_FEEDBACK, "not a stream")  # XADD now fails with WRONGTYPE
    token = issue(SECRET, "traj_1", "u1", "v0", 3600)
    with pytest.raises(FeedbackRejected) as caught:
        await intake.accept(rating(token))
    assert caught.value.status == 500 and "WRONGTYPE" in caught.value.reason
    assert "nothing was written" in caught.value.reason and markers(redis_client) == []

    redis_client.delete(STREAM_FEEDBACK)
    assert await intake.accept(rating(token)) == feedback_event_id("traj_1", "rating")
    with pytest.raises(FeedbackRejected) as again:
        await intake.accept(rating(token))
    assert again.value.status == 409
    assert redis_client.xlen(STREAM_FEEDBACK) == 1


async def test_a_refused_marker_writes_no_event(aredis, redis_client):  # noqa: F811
    """The script's own guard, below the Python check: an out-of-range TTL writes nothing."""
    script = aredis.register_script(_ACCEPT)
    keys = ["rate:k", f"{FEEDBACK_SEEN_PREFIX}:t:score:a", STREAM_FEEDBACK, "rate:c", "scores:t"]
    status, detail = await script(keys=keys, args=[60, 120, 10**17, "fb_x|n1", 0, 8, 0, "f", "v"])
    assert status == b"error" and b"invalid expire time" in detail
    assert redis_client.xlen(STREAM_FEEDBACK) == 0 and markers(redis_client) == []
    assert redis_client.get("scores:t") in (None, b"0")  # the named score is not counted


async def test_a_retried_call_finds_its_own_marker_and_is_not_a_duplicate(aredis, redis_client):  # noqa: F811
    """redis-py resends a script whose reply was lost to a dropped connection: the second run
    sees the marker of the first (same nonce) and answers as it did, with no second XADD."""
    script = aredis.register_script(_ACCEPT)
    keys = ["rate:k", f"{FEEDBACK_SEEN_PREFIX}:t:rating", STREAM_FEEDBACK, "rate:c", "scores:t"]
    args = [60, 120, 3600, "fb_x|n1", 0, 0, 0, "f", "v"]
    first, second = await script(keys=keys, args=args), await script(keys=keys, args=args)
    other = await script(keys=keys, args=[60, 120, 3600, "fb_x|n2", 0, 0, 0, "f", "v"])
    assert first[0] == b"ok" and second[0] == b"again" and other[0] == b"dup"
    assert redis_client.xlen(STREAM_FEEDBACK) == 1


async def test_a_token_of_another_tenants_user_is_refused_whatever_the_body_says(
    intake,
    redis_client,
):
    """Issue 36: tenant B's key posting tenant A's token with no user_id got 202."""
    token = issue(SECRET, "traj_1", "acme:u_abc", "v0", 3600)
    foreign = FeedbackSubmission("traj_1", token, "rating", 5.0, user_id=None, tenant="beta")
    with pytest.raises(FeedbackRejected) as refused:
        await intake.accept(foreign)
    assert refused.value.status == 403 and "another tenant" in refused.value.reason
    own = FeedbackSubmission("traj_1", token, "rating", 5.0, user_id=None, tenant="acme")
    assert await intake.accept(own)
    assert redis_client.xlen(STREAM_FEEDBACK) == 1


async def test_one_run_takes_a_bounded_number_of_named_scores(aredis, redis_client):  # noqa: F811
    """Issue 36: one token took 50 distinct named scores; now `scores_per_run` of them."""
    intake = FeedbackIntake(aredis, SECRET, rate_per_minute=1000, scores_per_run=3)
    token = issue(SECRET, "traj_1", "u1", "v0", 3600)

    def score(name: str) -> FeedbackSubmission:
        return FeedbackSubmission("traj_1", token, "score", 0.5, user_id="u1", key=name)

    for name in ("clarity", "accuracy", "tone"):
        await intake.accept(score(name))
    with pytest.raises(FeedbackRejected) as capped:
        await intake.accept(score("speed"))
    assert capped.value.status == 409 and "3 named scores" in capped.value.reason
    assert await intake.accept(rating(token))  # the other kinds keep their own slot
    assert redis_client.xlen(STREAM_FEEDBACK) == 4


async def test_the_feedback_stream_keeps_about_its_cap(aredis, redis_client):  # noqa: F811
    """Issue 36, item 6: the intake's XADD trims with MAXLEN ~ when a cap is set."""
    intake = FeedbackIntake(aredis, SECRET, rate_per_minute=10_000, max_entries=100)
    for n in range(400):
        await intake.accept(rating(issue(SECRET, f"traj_{n}", "u1", "v0", 3600), f"traj_{n}"))
    assert 100 <= redis_client.xlen(STREAM_FEEDBACK) < 250
