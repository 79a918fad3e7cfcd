"""Dependencies of the agent API routes, as `Annotated` types."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from deploy.agent_api.errors import Unauthorized
from deploy.agent_api.services import Services

_bearer = HTTPBearer(auto_error=False, description="One of ARLOOP_API_KEYS.")


async def get_services(request: Request) -> Services:
    # async: FastAPI runs plain `def` dependencies in a thread pool, a cost on every request
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


async def require_api_key(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The caller's API key; 401 when it is missing or unknown."""
    if credentials is None:
        raise Unauthorized("missing header 'Authorization: Bearer <api key>'")
    sent = credentials.credentials.encode()
    if not any(hmac.compare_digest(sent, k.encode()) for k in services.settings.api_keys):
        raise Unauthorized("unknown API key")
    return credentials.credentials


ApiKey = Annotated[str, Depends(require_api_key)]
