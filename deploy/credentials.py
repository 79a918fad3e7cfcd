"""Who may call the agent API, and as whom: API keys bound to a tenant and an identity, the
signed user tokens an upstream app issues, and the strength a production secret needs.

A key's `identity` says where the acting user comes from:
- `any`: the request's `user_id`, as the client says (a backend that authenticates its own
  users; the per-credential rate limit and reward cap bound what one key can do);
- `user`: always the key's `user` (one person's key); another `user_id` is refused (403);
- `signed`: the `X-Arloop-User` header, `<user>.<expires>.<mac>` signed with
  `ARLOOP_USER_TOKEN_SECRET` by the app that logged the user in (`sign_user_token`);
- `header`: the gateway's header (`ARLOOP_USER_HEADER`) names the user; the key is the
  gateway's own, so only the gateway can send it.
A key's `scopes` grant more than running agents and reading one's own: `review` lets a
reviewer (a clinician, a teacher) browse the tenant's runs and judge them from the annotation
queue (`deploy.agent_api.review`); any other key is refused there (403).
Users of a tenant other than `default` are namespaced (`acme:u1`), so two tenants' `u1` never
share a thread, a memory or a rate window.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time
from collections import Counter
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

NAME = r"^[A-Za-z0-9_-]{1,64}$"
USER = r"^[A-Za-z0-9_.@+-]{1,128}$"
KEY_MIN_CHARS, KEY_MIN_BITS = 24, 96
SECRET_MIN_CHARS, SECRET_MIN_BITS = 32, 128
HOW_TO_MAKE_ONE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
DEFAULT_TENANT = "default"
PSEUDONYM_PREFIX = "u_"
DEVELOPMENT_PREFIX = "arloop-development-"
"""Values that start so are the manifests' development placeholders: refused in production."""


class Identity(StrEnum):
    """Where a key's acting user comes from (see the module docstring)."""

    ANY = "any"
    USER = "user"
    SIGNED = "signed"
    HEADER = "header"


class Scope(StrEnum):
    """What a key may do beyond running agents and reading its own runs and feedback."""

    REVIEW = "review"
    """Browse every run of the key's tenant and judge them from the annotation queue."""


class ApiKey(BaseModel):
    """One client credential of the agent API."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr
    """The bearer token the client sends."""
    name: str = Field(pattern=NAME)
    """The credential's name: on logs, metrics and the events it writes (never the key)."""
    tenant: str = Field("default", pattern=NAME)
    """Its tenant; users of a tenant other than `default` are namespaced `tenant:user`."""
    identity: Identity = Identity.ANY
    """Where the acting user comes from: any, user, signed or header."""
    user: str | None = Field(None, pattern=USER)
    """The one user a key of identity `user` acts as."""
    rate_per_minute: int | None = Field(None, ge=1)
    """Runs (and, apart, feedback) this key may send per minute, all its users together;
    unset: ARLOOP_KEY_RATE_PER_MINUTE."""
    scopes: frozenset[Scope] = frozenset()
    """Scopes beyond the default (`review`: a reviewer's key; see the module docstring)."""

    @model_validator(mode="after")
    def _user_iff_fixed(self) -> ApiKey:
        if (self.identity is Identity.USER) != (self.user is not None):
            raise ValueError(
                f"API key {self.name!r}: `user` is set exactly when identity is 'user' "
                "(the one user the key acts as)"
            )
        return self

    def scoped(self, user: str) -> str:
        """The user as this key's tenant knows it (`scoped_user`)."""
        return scoped_user(self.tenant, user)


class PolicyKey(BaseModel):
    """One client credential of the policy server (`ARLOOP_POLICY_KEYS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr
    """The bearer token the client sends (litellm's and the openai SDK's `api_key`)."""
    name: str = Field(pattern=NAME)
    """The credential's name, on logs (never the key)."""
    gate: bool = False
    """The eval gate's key (the learner's `ARLOOP_POLICY_API_KEY`): the only one that may sample
    a version the gate rejected, by name."""


def plain_key(key: str) -> dict[str, str]:
    """A bare string in ARLOOP_API_KEYS: identity `any`, named by a digest of the key."""
    return {"key": key, "name": "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]}


def plain_keys(value: Any) -> Any:
    """A key list as settings read it (before validation): each bare string made `plain_key`'s
    entry, anything else left for the model to check."""
    if isinstance(value, list):
        return [plain_key(v) if isinstance(v, str) else v for v in value]
    return value


def entropy_bits(value: str) -> float:
    """A cautious strength estimate: length times the empirical entropy of its characters
    (`"a" * 32` has 0 bits; a `secrets.token_urlsafe(32)` about 190)."""
    if not value:
        return 0.0
    counts = Counter(value)
    per_char = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return per_char * len(value)


def weakness(value: str, min_chars: int, min_bits: int) -> str | None:
    """Why `value` is too weak a secret, or None when it is strong enough."""
    if len(value) < min_chars:
        return f"it has {len(value)} characters, fewer than {min_chars}"
    bits = entropy_bits(value)
    if bits < min_bits:
        return f"it carries about {bits:.0f} bits of entropy, fewer than {min_bits}"
    return None


def placeholder(value: str) -> str | None:
    """Why `value` must not serve in production when it is one of the manifests' development
    placeholders (`arloop-development-...`), else None."""
    if value.startswith(DEVELOPMENT_PREFIX):
        return "the development value of the manifests' Secret"
    return None


def key_weakness(key: str) -> str | None:
    """Why a production process must not use this key or Redis password, or None: a
    development placeholder, or weaker than an API key must be."""
    return placeholder(key) or weakness(key, KEY_MIN_CHARS, KEY_MIN_BITS)


# -- user ids as arloop stores them --------------------------------------------------------


def scoped_user(tenant: str, user: str) -> str:
    """`user` in the default tenant, `tenant:user` otherwise: what `pseudonym` hashes, never
    stored as is."""
    return user if tenant == DEFAULT_TENANT else f"{tenant}:{user}"


def pseudonym(key: bytes, scoped_user: str) -> str:
    """The id arloop stores for a user (`ApiKey.scoped`): a keyed hash, so an email address or a
    patient number never reaches a Redis key name, a stream, an export or a token.

    `u_<24 base32 chars>` (120 bits of HMAC-SHA256 under `key`) in the default tenant,
    `tenant:u_<...>` in another: the tenant stays readable, for scoping reads."""
    mac = hmac.new(key, scoped_user.encode(), hashlib.sha256).digest()[:15]
    name = PSEUDONYM_PREFIX + base64.b32encode(mac).decode().lower()
    tenant, sep, _ = scoped_user.rpartition(":")
    return f"{tenant}:{name}" if sep else name


def tenant_of(user_id: str) -> str:
    """The tenant of a stored user id (`tenant:u_...`, or the default tenant's `u_...`)."""
    tenant, sep, _ = user_id.rpartition(":")
    return tenant if sep else DEFAULT_TENANT


# -- signed user tokens (identity `signed`) -------------------------------------------------


class UserTokenError(ValueError):
    """A user token that cannot be accepted; the message says why."""


def sign_user_token(secret: str, user: str, ttl_s: int = 3600, now: float | None = None) -> str:
    """`<user>.<expires>.<mac>`: what an upstream app sends as `X-Arloop-User` for a user it
    has authenticated (HMAC-SHA256 with ARLOOP_USER_TOKEN_SECRET, valid `ttl_s` seconds)."""
    expires = int((time.time() if now is None else now) + ttl_s)
    return f"{user}.{expires}.{_mac(secret, f'{user}.{expires}')}"


def verify_user_token(secret: str, token: str, now: float | None = None) -> str:
    """The user a genuine, unexpired token names; UserTokenError otherwise."""
    user, expires, mac = (token.rsplit(".", 2) + ["", ""])[:3]
    if not (user and expires.isdigit() and mac):
        raise UserTokenError("is not <user>.<expires>.<mac>")
    if not hmac.compare_digest(mac, _mac(secret, f"{user}.{expires}")):
        raise UserTokenError("is not signed with ARLOOP_USER_TOKEN_SECRET")
    if int(expires) < (time.time() if now is None else now):
        raise UserTokenError("has expired")
    return user


def _mac(secret: str, payload: str) -> str:
    digest = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
