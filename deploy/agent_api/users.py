"""`DELETE /v1/users/{user_id}`: erase one user's data (`agents.erasure`), since the service
keeps medical talk; `arloop forget --user` does the same from the command line."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from agents.erasure import forget_user
from deploy.agent_api.deps import CallerDep
from deploy.agent_api.schemas import ErasedView, UserId, errors

router = APIRouter()


@router.delete(
    "/v1/users/{user_id}", response_model=ErasedView, responses=errors(401, 403, 422, 429, 500, 503)
)
async def forget(
    user_id: Annotated[UserId, Path(description="The user as this key names them.")],
    caller: CallerDep,
) -> ErasedView:
    """Erase a user's threads, memories and logged runs and feedback (a key that acts as one
    user may erase only that user); the learner erases its copy at its next poll. Weights
    already trained on the data are not retrained."""
    stored = caller.user(user_id)
    services = caller.services
    key_rate = caller.rate_per_minute(services.settings.key_rate_per_minute)
    # an erasure scans the streams: a few a minute per user, the key's rate for all its users
    await services.limiter.hit("erasures", stored, 6, credential=(caller.key.name, key_rate))
    erased = await forget_user(services.redis, stored, services.settings.shards)
    return ErasedView(user_id=user_id, **erased.view())
