"""Feedback tokens: the claims of one run (trajectory, user, policy version, expiry, agent),
sealed with AES-256-GCM under a key derived from ARLOOP_SECRET_KEY.

Sealed, not only signed: the token is opaque to whoever holds it (the user id in it is already a
pseudonym, `deploy.credentials.pseudonym`, and the rest is no one's business), and any change to
it fails the tag. The user id carries its tenant (`tenant:u_...`), so a token answers for one
tenant's user whatever a request's body says (`check_scope`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from agents.errors import ArloopError

MAX_TOKEN_TTL_S = 400 * 24 * 3600
"""The longest life a feedback token may have (`ARLOOP_FEEDBACK_TOKEN_TTL_S` is bounded by it):
a replay marker must outlive its token, and Redis refuses absurd expiry times."""
FORMAT = b"\x02"
"""The token's first byte (and its associated data): tokens of the signed-only format 1, which
showed their claims, are refused."""
NONCE_BYTES = 12


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
    """The sealed claims, base64url without padding."""
    fields = [
        claims.trajectory_id,
        claims.user_id,
        claims.policy_version,
        claims.expires_at,
        claims.agent,
    ]
    body = json.dumps(fields, separators=(",", ":")).encode()
    nonce = os.urandom(NONCE_BYTES)  # 96 random bits: safe for far more tokens than any key sees
    sealed = _aead(secret).encrypt(nonce, body, FORMAT)
    return base64.urlsafe_b64encode(FORMAT + nonce + sealed).rstrip(b"=").decode()


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
    claims = _open(secret, token)
    if claims is None:
        raise TokenError(
            401,
            "feedback_token is not valid (altered, of an older format, or not issued by this "
            "service); send the token the run returned, unchanged",
        )
    if claims.expires_at < (time.time() if now is None else now):
        raise TokenError(401, "feedback_token has expired: feedback on this run is closed")
    return claims


def check_scope(claims: TokenClaims, trajectory_id: str, user_id: str | None, tenant: str) -> None:
    """TokenError(403) when the token is for another trajectory, another tenant's user, or
    (when the caller acts as a user) another user."""
    from_tenant, sep, _ = claims.user_id.rpartition(":")
    if claims.trajectory_id != trajectory_id:
        raise TokenError(
            403, "feedback_token belongs to another trajectory: send the one its run returned"
        )
    if (from_tenant if sep else "default") != tenant:
        raise TokenError(
            403, "feedback_token belongs to another tenant's user: this API key cannot rate it"
        )
    if user_id is not None and user_id != claims.user_id:
        raise TokenError(403, "feedback_token belongs to another user: only they can rate this run")


def _open(secret: str, token: str) -> TokenClaims | None:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        if raw[:1] != FORMAT:
            return None
        nonce, sealed = raw[1 : 1 + NONCE_BYTES], raw[1 + NONCE_BYTES :]
        values = json.loads(_aead(secret).decrypt(nonce, sealed, FORMAT))
        if not isinstance(values, list) or len(values) != 5:
            return None
        claims = TokenClaims(*values)
    except (InvalidTag, ValueError, TypeError, binascii.Error):
        return None
    return claims if _well_formed(claims) else None


def _well_formed(claims: TokenClaims) -> bool:
    texts = (claims.trajectory_id, claims.user_id, claims.policy_version)
    agent_ok = claims.agent is None or isinstance(claims.agent, str)
    expires_ok = isinstance(claims.expires_at, int) and not isinstance(claims.expires_at, bool)
    return all(isinstance(v, str) for v in texts) and expires_ok and agent_ok


@lru_cache(maxsize=8)
def _aead(secret: str) -> AESGCM:
    """The AEAD for a secret (HKDF-SHA256 to 256 bits; one per secret, derived once)."""
    kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"arloop feedback token")
    return AESGCM(kdf.derive(secret.encode()))
