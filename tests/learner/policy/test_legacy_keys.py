"""A plain Redis holding the registry from before the hash tags is moved to the tagged names
once, TTLs kept, and a second run moves nothing."""

from __future__ import annotations

from agents.events import LEARNER_LEASE
from learner.policy.legacy_keys import migrate_legacy_keys
from learner.policy.registry import CHAMPION, PolicyRegistry


def test_an_old_registry_is_moved_once(redis_client):
    redis_client.hset("arloop:policy:aliases", CHAMPION, "v1")
    redis_client.zadd("arloop:policy:versions", {"v0": 1.0, "v1": 2.0})
    for v, status in (("v0", "retired"), ("v1", "champion")):
        fields = {"version": v, "parent": "", "base_model": "tiny", "status": status}
        redis_client.hset(f"arloop:policy:v:{v}", mapping={k: f'"{x}"' for k, x in fields.items()})
    redis_client.set("arloop:policy:seq", 1)
    redis_client.set("arloop:learner:fence", 7)
    redis_client.set("arloop:learner:lease", "7|learner-1@h:1", px=30_000)
    redis_client.xadd("arloop:policy:events", {"x": "1"})

    assert migrate_legacy_keys(redis_client) == 8
    reg = PolicyRegistry(redis_client)
    assert reg.aliases() == {CHAMPION: "v1"} and reg.names() == {"v0", "v1"}
    assert reg.counter() == 1 and redis_client.pttl(LEARNER_LEASE) > 0
    assert not redis_client.exists("arloop:policy:aliases", "arloop:policy:v:v1")
    assert migrate_legacy_keys(redis_client) == 0
