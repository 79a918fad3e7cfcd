"""Dependencies of the agent API routes, as `Annotated` types."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated

from fastapi import Depends, Request

from agents.errors import ArloopError
from deploy.agent_api.errors import Unauthorized
from deploy.agent_api.services import Services
from deploy.credentials import (
    USER,
    ApiKey,
    Identity,
    Scope,
    UserTokenError,
    pseudonym,
    tenant_of,
    verify_user_token,
)

USER_TOKEN_HEADER = "X-Arloop-User"
CREDENTIAL = "arloop.credential"
"""The trajectory metadata key naming the API key that started a run."""


async def get_services(request: Request) -> Services:
    # async: FastAPI runs plain `def` dependencies in a thread pool, a cost on every request
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


@dataclass(frozen=True)
class Caller:
    """The credential a request came with, and the user its identity vouches for."""

    key: ApiKey
    vouched: str | None
    """The user of a `user`, `signed` or `header` identity; None for `any`."""
    services: Services
    """The app's services (so a hot route needs no second dependency)."""

    def user(self, requested: str | None) -> str | None:
        """The stored id of the user to act as (`pseudonym` of the tenant-scoped id): the vouched
        user, or the requested one for an `any` key; 403 when the request names someone else
        than the vouched user."""
        if self.vouched is None:
            return None if requested is None else self._stored(requested)
        if requested is not None and requested != self.vouched:
            raise ArloopError(
                403,
                f"this API key acts as user {self.vouched!r} ({self.key.identity.value} "
                f"identity); user_id {requested!r} is not theirs",
            )
        return self._stored_vouched

    def sees(self, user_id: str) -> bool:
        """Whether a stored user's runs and feedback are this caller's to read: its tenant's
        (a backend's `any` key), or its one user's (a key that acts as one user)."""
        if self.vouched is not None:
            return user_id == self._stored_vouched
        return tenant_of(user_id) == self.key.tenant

    @property
    def reviewer(self) -> bool:
        """Whether the key has the `review` scope (`deploy.credentials.Scope`)."""
        return Scope.REVIEW in self.key.scopes

    def reads(self, user_id: str) -> bool:
        """Whether a stored user's runs are this caller's to browse: what it `sees`, and for a
        reviewer every user of its tenant."""
        if self.reviewer:
            return tenant_of(user_id) == self.key.tenant
        return self.sees(user_id)

    def as_reviewer(self) -> str:
        """The reviewer's stored id (its vouched user's, or for an `any` key one named after the
        key); 403 for a key without the `review` scope."""
        if not self.reviewer:
            raise ArloopError(
                403,
                f"API key {self.key.name!r} has no 'review' scope: reviews take a reviewer's "
                'key (in ARLOOP_API_KEYS, `"scopes": ["review"]`)',
            )
        return self._stored_vouched if self.vouched else self._stored(f"key.{self.key.name}")

    @cached_property
    def _stored_vouched(self) -> str:
        """The vouched user's stored id, hashed once (`sees` asks for every event read)."""
        return self._stored(self.vouched or "")

    def rate_per_minute(self, default: int) -> int:
        return self.key.rate_per_minute or default

    def _stored(self, user: str) -> str:
        return pseudonym(self.services.user_key, self.key.scoped(user))


async def require_api_key(request: Request) -> Caller:
    """The caller's credential and vouched user; 401 when the key or the identity is missing.

    One dependency reading the header itself (FastAPI's HTTPBearer and a services dependency
    cost a fifth of a feedback post's CPU); the OpenAPI schema declares the bearer scheme
    (`deploy.agent_api.app._openapi`)."""
    services: Services = request.app.state.services
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing header 'Authorization: Bearer <api key>'")
    sent = token.strip().encode()
    for key in services.settings.api_keys:
        if hmac.compare_digest(sent, key.key.get_secret_value().encode()):
            return Caller(key, _vouched(key, request, services), services)
    raise Unauthorized("unknown API key")


def _vouched(key: ApiKey, request: Request, services: Services) -> str | None:
    if key.identity is Identity.USER:
        return key.user
    if key.identity is Identity.SIGNED:
        token = request.headers.get(USER_TOKEN_HEADER)
        if not token:
            raise Unauthorized(f"this API key needs a signed user token in {USER_TOKEN_HEADER}")
        secret = services.settings.user_token_secret
        try:
            user = verify_user_token(secret.get_secret_value() if secret else "", token)
        except UserTokenError as exc:
            raise Unauthorized(f"the {USER_TOKEN_HEADER} token {exc}") from None
    elif key.identity is Identity.HEADER:
        name = services.settings.user_header
        user = request.headers.get(name)
        if not user:
            raise Unauthorized(f"this API key is the gateway's: it needs the user in {name}")
    else:
        return None
    if not re.fullmatch(USER, user):
        raise Unauthorized(f"the user {user[:40]!r} is not a valid user id ({USER})")
    return user


CallerDep = Annotated[Caller, Depends(require_api_key)]
