"""Moves a registry written before the hash tags (`arloop:policy:aliases`, ...) to its tagged
names (`arloop:policy:{policy}:aliases`, ...), in one script, on a plain Redis.

A Redis Cluster can only run the registry's write script on keys of one slot, hence the
`{policy}` tag (`agents.events`). A plain Redis holding the old names is moved once, at the
learner's start or by `arloop policy` (both may rename `arloop:policy:*` and
`arloop:learner:*`): every old key that exists while its new name does not is renamed, TTLs
kept, so a second run, or a racing one, moves nothing. A cluster never held the old layout
(it could not run it), so there is nothing to move there.
"""

from __future__ import annotations

from typing import Any

from agents.events import LEGACY_KEYS, LEGACY_VERSION_PREFIX, is_cluster, policy_version_key

# KEYS: old, new, old, new, ... Renames each old key whose new name is free; returns how many.
_MOVE = """
local moved = 0
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 and redis.call('EXISTS', KEYS[i + 1]) == 0 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    moved = moved + 1
  end
end
return moved
"""


def migrate_legacy_keys(client: Any) -> int:
    """Rename the registry's and the lease's pre-tag keys to their tagged names; how many moved."""
    if is_cluster(client):
        return 0
    versions = [v.decode() for v in client.zrange("arloop:policy:versions", 0, -1)]
    pairs = list(LEGACY_KEYS.items())
    pairs += [(LEGACY_VERSION_PREFIX + v, policy_version_key(v)) for v in versions]
    return int(client.eval(_MOVE, len(pairs) * 2, *[k for pair in pairs for k in pair]))
