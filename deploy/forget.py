"""`arloop forget --user`: erase one user's data, as `DELETE /v1/users/{user_id}` does."""

from __future__ import annotations

import asyncio
import re

from rich.console import Console

from agents.erasure import Erased, forget_user
from deploy.credentials import NAME, USER, pseudonym, scoped_user
from deploy.embedded_redis import ensure_redis
from deploy.settings import AgentApiSettings


def main(user: str, tenant: str) -> int:
    """Erase `user` of `tenant` with the agent API's settings (its Redis and its pseudonym
    key); 0 when done."""
    for what, value, pattern in (("--user", user, USER), ("--tenant", tenant, NAME)):
        if not re.fullmatch(pattern, value):
            Console(stderr=True).print(
                f"arloop forget: {what} {value[:60]!r} is not a valid id (it must match "
                f"{pattern}): give it as your app sends it to the agent API",
                highlight=False,
            )
            return 2
    settings = AgentApiSettings()
    url = ensure_redis(settings.redis_url, settings.data_dir)
    stored = pseudonym(settings.pseudonym_key(), scoped_user(tenant, user))
    erased = asyncio.run(_forget(url, settings, stored))
    Console().print(
        f"erased user {user!r} of tenant {tenant!r} (stored as {stored}): {erased.threads} "
        f"threads, {erased.memories} memory lists, {erased.events} logged runs and feedback. "
        "The learner erases its copy at its next poll (or when it starts); weights already "
        "trained on this user's data are not retrained.",
        highlight=False,
    )
    return 0


async def _forget(url: str, settings: AgentApiSettings, stored: str) -> Erased:
    client = settings.async_redis(url)
    try:
        return await forget_user(client, stored, settings.shards)
    finally:
        await client.aclose()
