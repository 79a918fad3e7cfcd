"""Run ids that land on chosen stream shards.

A run's shard is a hash of its random id, so runs made with fresh ids spread over the shards
only with high probability: 6 runs on 3 shards all fall on one once in 243, and 9 runs miss a
shard once in 13. A test that needs its runs spread takes its ids from here and has them
spread every time: shard 0, 1, ..., count - 1, 0, ... in turn, each id still fresh.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from agents.events import StreamShards, new_id


def id_on_shard(shards: StreamShards, shard: int, prefix: str = "traj") -> str:
    """A fresh id (as `new_id` makes) whose run goes to `shard`."""
    while True:  # each try lands on `shard` with probability 1 / count
        candidate = new_id(prefix)
        if shards.of(candidate) == shard:
            return candidate


def spread_ids(shards: StreamShards, prefix: str = "traj") -> Iterator[str]:
    """Fresh ids whose runs go to the shards in turn."""
    for i in itertools.count():
        yield id_on_shard(shards, i % shards.count, prefix)


def spread_new_id(shards: StreamShards) -> Callable[[str], str]:
    """A stand-in for `new_id` in the agent API: its run ids go to the shards in turn, every
    other id is as `new_id` makes it."""
    runs = spread_ids(shards)

    def make(prefix: str) -> str:
        return next(runs) if prefix == "traj" else new_id(prefix)

    return make
