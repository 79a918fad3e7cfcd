"""Feedback tokens: genuine ones verify; altered, expired, foreign or missing ones do not."""

from __future__ import annotations

import time

import pytest

from agents.feedback_tokens import TokenClaims, TokenError, check_scope, issue, sign, verify

SECRET = "s" * 32


def test_round_trip_carries_the_claims():
    token = issue(SECRET, "traj_1", "u1", "v3", ttl_s=60)
    claims = verify(SECRET, token)
    assert (claims.trajectory_id, claims.user_id, claims.policy_version) == ("traj_1", "u1", "v3")
    assert time.time() < claims.expires_at <= time.time() + 61
    assert "=" not in token and "+" not in token and "/" not in token  # base64url, no padding


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # altered mac
        lambda t: (
            sign(SECRET, TokenClaims("traj_1", "u2", "v3", 2**40)).split(".")[0]
            + "."
            + t.split(".")[1]
        ),  # payload swapped under the old mac
        lambda t: t.split(".")[0],  # no mac
        lambda t: "!!!." + t.split(".")[1],  # not base64
        lambda t: issue("another-secret" * 3, "traj_1", "u1", "v3", ttl_s=60),
    ],
)
def test_altered_or_foreign_tokens_are_401(mangle):
    token = mangle(issue(SECRET, "traj_1", "u1", "v3", ttl_s=60))
    with pytest.raises(TokenError) as err:
        verify(SECRET, token)
    assert err.value.status == 401 and "not valid" in err.value.reason


def test_missing_and_expired_tokens_are_401():
    for token, reason in [
        (None, "missing"),
        ("", "missing"),
        (sign(SECRET, TokenClaims("t", "u", "v", 100)), "expired"),
    ]:
        with pytest.raises(TokenError) as err:
            verify(SECRET, token)
        assert err.value.status == 401 and reason in err.value.reason


def test_well_signed_garbage_claims_are_401():
    import base64
    import hashlib
    import hmac

    payload = base64.urlsafe_b64encode(b'{"not": "a list"}').rstrip(b"=").decode()
    mac = hmac.new(SECRET.encode(), payload.encode(), hashlib.sha256).digest()
    token = f"{payload}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
    with pytest.raises(TokenError):
        verify(SECRET, token)


def test_scope_is_403_for_another_trajectory_or_user():
    claims = verify(SECRET, issue(SECRET, "traj_1", "u1", "v3", ttl_s=60))
    check_scope(claims, "traj_1", "u1")
    check_scope(claims, "traj_1", None)
    for trajectory, user in [("traj_2", None), ("traj_1", "u2")]:
        with pytest.raises(TokenError) as err:
            check_scope(claims, trajectory, user)
        assert err.value.status == 403
