"""Feedback tokens: genuine ones verify; altered, expired, foreign or missing ones do not; the
claims are sealed (no one reads them from the token); the scope is the trajectory, the tenant
and, when the caller acts as one, the user."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest

from agents.feedback_tokens import TokenClaims, TokenError, check_scope, issue, sign, verify

SECRET = "s" * 32


def test_round_trip_carries_the_claims():
    token = issue(SECRET, "traj_1", "u1", "v3", ttl_s=60, agent="tutor")
    claims = verify(SECRET, token)
    assert (claims.trajectory_id, claims.user_id, claims.policy_version) == ("traj_1", "u1", "v3")
    assert claims.agent == "tutor"
    assert time.time() < claims.expires_at <= time.time() + 61
    assert "=" not in token and "+" not in token and "/" not in token  # base64url, no padding


def test_the_claims_cannot_be_read_from_the_token():
    """Issue 36: the payload was readable base64 JSON, user id included."""
    token = issue(SECRET, "traj_visible", "alice@example.org", "v3", ttl_s=60, agent="tutor")
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    for claim in (b"traj_visible", b"alice@example.org", b"tutor", b"v3"):
        assert claim not in raw
    assert token != issue(SECRET, "traj_visible", "alice@example.org", "v3", ttl_s=60)  # nonce


def _flip(token: str, at: int) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[at] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


def _format_one(claims: list) -> str:
    """A token of the old signed-only format (readable claims, HMAC over them)."""
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    mac = hmac.new(SECRET.encode(), payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: _flip(t, 20),  # a bit of the sealed claims
        lambda t: _flip(t, -1),  # a bit of the tag
        lambda t: _flip(t, 0),  # the format byte
        lambda t: t[:-6],  # cut short
        lambda t: "!!!" + t[3:],  # not base64
        lambda t: issue("another-secret" * 3, "traj_1", "u1", "v3", ttl_s=60),
        lambda t: _format_one(["traj_1", "u1", "v3", 2**40]),
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


def test_well_sealed_garbage_claims_are_401():
    bad = TokenClaims("traj_1", ["not", "text"], "v3", 2**40)  # type: ignore[arg-type]
    with pytest.raises(TokenError):
        verify(SECRET, sign(SECRET, bad))
    with pytest.raises(TokenError):
        verify(SECRET, sign(SECRET, TokenClaims("traj_1", "u1", "v3", True)))  # type: ignore[arg-type]


def test_scope_is_403_for_another_trajectory_tenant_or_user():
    claims = verify(SECRET, issue(SECRET, "traj_1", "u1", "v3", ttl_s=60))
    check_scope(claims, "traj_1", "u1", "default")
    check_scope(claims, "traj_1", None, "default")  # a backend's key, acting for its users
    for trajectory, user, tenant, reason in [
        ("traj_2", None, "default", "another trajectory"),
        ("traj_1", "u2", "default", "another user"),
        ("traj_1", None, "acme", "another tenant"),
    ]:
        with pytest.raises(TokenError) as err:
            check_scope(claims, trajectory, user, tenant)
        assert err.value.status == 403 and reason in err.value.reason
    acme = verify(SECRET, issue(SECRET, "traj_1", "acme:u1", "v3", ttl_s=60))
    check_scope(acme, "traj_1", None, "acme")
    with pytest.raises(TokenError):
        check_scope(acme, "traj_1", None, "default")
