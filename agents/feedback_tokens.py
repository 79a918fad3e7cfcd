"""Feedback tokens: HMAC-SHA256 over trajectory id, user id, policy version, expiry and agent.

The agent is the fifth claim since feedback listings filter by it; a token issued before it
existed (four claims) still verifies, with no agent.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from agents.errors import ArloopError

MAX_TOKEN_TTL_S = 400 * 24 * 3600
"""The longest life a feedback token may have (`ARLOOP_FEEDBACK_TOKEN_TTL_S` is bounded by it):
a replay marker must outlive its token, and Redis refuses absurd expiry times."""


class TokenError(ArloopError):
    """A token that cannot be accepted; `status` is 401 (not valid) or 403 (not yours)."""


@dataclass(frozen=True)
class TokenClaims:
    """What a token vouches for."""

    trajectory_id: str
    user_id: str
    policy_version: str
    expires_at: int
    agent: str | None = None


def sign(secret: str, claims: TokenClaims) -> str:
    """`<payload>.<mac>`, both base64url without padding."""
    fields = [claims.trajectory_id, claims.user_id, claims.policy_version, claims.expires_at]
    fields += [claims.agent] if claims.agent is not None else []
    body = json.dumps(fields, separators=(",", ":")).encode()
    payload = _b64(body)
    return f"{payload}.{_b64(_mac(secret, payload))}"


def issue(
    secret: str,
    trajectory_id: str,
    user_id: str,
    policy_version: str,
    ttl_s: int,
    agent: str | None = None,
) -> str:
    """A token for one trajectory (of `agent`), valid `ttl_s` seconds from now."""
    expires = int(time.time()) + ttl_s
    return sign(secret, TokenClaims(trajectory_id, user_id, policy_version, expires, agent))


def verify(secret: str, token: str | None, *, now: float | None = None) -> TokenClaims:
    """The claims of a genuine, unexpired token; TokenError(401) otherwise."""
    if not token:
        raise TokenError(401, "feedback_token is missing: send the token the run returned")
    claims = _decode(secret, token)
    if claims is None:
        raise TokenError(
            401,
            "feedback_token is not valid (altered or not issued by this service); "
            "send the token the run returned, unchanged",
        )
    if claims.expires_at < (time.time() if now is None else now):
        raise TokenError(401, "feedback_token has expired: feedback on this run is closed")
    return claims


def check_scope(claims: TokenClaims, trajectory_id: str, user_id: str | None) -> None:
    """TokenError(403) when the token is for another trajectory or another user."""
    if claims.trajectory_id != trajectory_id:
        raise TokenError(
            403, "feedback_token belongs to another trajectory: send the one its run returned"
        )
    if user_id is not None and user_id != claims.user_id:
        raise TokenError(403, "feedback_token belongs to another user: only they can rate this run")


def _decode(secret: str, token: str) -> TokenClaims | None:
    payload, _, mac = token.partition(".")
    try:
        if not hmac.compare_digest(_unb64(mac), _mac(secret, payload)):
            return None
        values = json.loads(_unb64(payload))
        if not isinstance(values, list) or len(values) not in (4, 5):
            return None
        claims = TokenClaims(*values)
    except (ValueError, TypeError):
        return None
    return claims if _well_formed(claims) else None


def _well_formed(claims: TokenClaims) -> bool:
    texts = (claims.trajectory_id, claims.user_id, claims.policy_version)
    agent_ok = claims.agent is None or isinstance(claims.agent, str)
    return (
        all(isinstance(v, str) for v in texts) and isinstance(claims.expires_at, int) and agent_ok
    )


def _mac(secret: str, payload: str) -> bytes:
    return hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
