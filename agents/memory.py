"""Long-term memory in Redis: reflections and user facts per user and task kind, BM25 recall.

Layout: one Redis list per (user, task kind, kind) under `MEMORY_PREFIX`, newest first,
capped at `max_items`; each entry is JSON `{"text", "created_at", "source"}`. Recall scores
every entry of the list against the query with BM25 (no embedding model is needed offline).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from agents.events import MEMORY_PREFIX

MemoryKind = Literal["reflection", "fact"]
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an and are as at be by for from has have how i in is it of on "  # noqa: SIM905
    "or that the this to was what when where which who why will with you your".split()
)


@dataclass(frozen=True)
class Memory:
    """One remembered text and how well it matched the query."""

    text: str
    created_at: float
    source: str = ""
    score: float = 0.0


class LongTermMemory:
    """Reflections and facts per user and task kind; `scrub` cleans texts before storing."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        max_items: int = 200,
        scrub: Callable[[str], str] | None = None,
        ttl_s: int | None = None,
    ) -> None:
        self.client = client
        self.max_items = max_items
        self.scrub = scrub
        self.ttl_s = ttl_s  # a user's list expires this long after its last write

    def key(self, user_id: str, task_kind: str | None, kind: MemoryKind) -> str:
        return f"{MEMORY_PREFIX}:{user_id}:{task_kind or 'default'}:{kind}"

    async def add(
        self, user_id: str, task_kind: str | None, kind: MemoryKind, text: str, source: str = ""
    ) -> None:
        """Remember one text (newest first; the oldest fall off past `max_items`)."""
        if self.scrub:
            text, source = self.scrub(text), self.scrub(source)
        entry = json.dumps({"text": text, "created_at": time.time(), "source": source})
        key = self.key(user_id, task_kind, kind)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lpush(key, entry).ltrim(key, 0, self.max_items - 1)
            if self.ttl_s:
                pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def recall(
        self, user_id: str, task_kind: str | None, kind: MemoryKind, query: str, k: int = 3
    ) -> list[Memory]:
        """The `k` entries that best match `query` (none when nothing shares a word with it)."""
        raw = await self.client.lrange(self.key(user_id, task_kind, kind), 0, -1)
        entries = [json.loads(r) for r in raw]
        docs = [f"{e['text']} {e.get('source', '')}" for e in entries]
        ranked = bm25_rank(query, docs)[:k]
        return [
            Memory(entries[i]["text"], entries[i]["created_at"], entries[i].get("source", ""), s)
            for i, s in ranked
        ]


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def bm25_rank(
    query: str, docs: list[str], k1: float = 1.2, b: float = 0.75
) -> list[tuple[int, float]]:
    """(doc index, BM25 score) for docs sharing a term with the query, best first."""
    terms = set(tokenize(query))
    tokenized = [tokenize(d) for d in docs]
    if not terms or not tokenized:
        return []
    avg_len = sum(map(len, tokenized)) / len(tokenized) or 1.0
    df = Counter(t for doc in tokenized for t in set(doc) if t in terms)
    n = len(tokenized)
    scores = []
    for i, doc in enumerate(tokenized):
        tf = Counter(doc)
        score = 0.0
        for t in terms & tf.keys():
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            score += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(doc) / avg_len))
        if score > 0:
            scores.append((i, score))
    return sorted(scores, key=lambda p: (-p[1], p[0]))
