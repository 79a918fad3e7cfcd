"""Long-term memory: BM25 ranking, per user and task kind, capped, scrubbed before storing."""

from __future__ import annotations

import pytest

from agents.events import MEMORY_PREFIX
from agents.memory import LongTermMemory, bm25_rank, tokenize


def test_tokenize_drops_stopwords_and_case():
    assert tokenize("What is the Dose of ibuprofen, 400mg?") == ["dose", "ibuprofen", "400mg"]


def test_bm25_prefers_rarer_and_repeated_terms():
    docs = ["fever and cough", "fever fever rash", "broken arm", "cough"]
    ranked = bm25_rank("fever rash", docs)
    assert [i for i, _ in ranked] == [1, 0]
    assert ranked[0][1] > ranked[1][1] > 0
    assert bm25_rank("headache", docs) == []
    assert bm25_rank("the", docs) == []  # nothing but stopwords


def test_bm25_ties_keep_the_newest_first():
    ranked = bm25_rank("sum", ["sum one", "sum two"])
    assert [i for i, _ in ranked] == [0, 1]
    assert ranked[0][1] == pytest.approx(ranked[1][1])


async def test_memories_are_kept_per_user_and_task_kind(aredis):
    memory = LongTermMemory(aredis)
    await memory.add("u1", "triage", "fact", "allergic to penicillin")
    await memory.add("u1", "tutoring", "fact", "allergic to long proofs")
    await memory.add("u2", "triage", "fact", "allergic to nuts")
    found = await memory.recall("u1", "triage", "fact", "which allergy? penicillin")
    assert [m.text for m in found] == ["allergic to penicillin"]
    assert await memory.recall("u1", "triage", "reflection", "penicillin") == []
    assert await aredis.exists(f"{MEMORY_PREFIX}:u1:triage:fact")


async def test_memory_is_capped_and_returns_the_best_k(aredis):
    memory = LongTermMemory(aredis, max_items=3)
    for i in range(5):
        await memory.add("u1", None, "reflection", f"lesson {i} about fractions")
    found = await memory.recall("u1", None, "reflection", "fractions", k=2)
    assert [m.text for m in found] == ["lesson 4 about fractions", "lesson 3 about fractions"]
    assert await aredis.llen(memory.key("u1", None, "reflection")) == 3


async def test_scrubber_runs_before_anything_is_stored(aredis):
    memory = LongTermMemory(aredis, scrub=lambda t: t.replace("Alice", "<PERSON>"))
    await memory.add("u1", "triage", "reflection", "Alice has a rash", source="Alice asked")
    [raw] = await aredis.lrange(memory.key("u1", "triage", "reflection"), 0, -1)
    assert b"Alice" not in raw and b"<PERSON>" in raw


async def test_memories_expire_after_their_last_write(aredis, redis_client):
    """Issue 36, item 6: per-user memory had no TTL; now it lives `ttl_s` past its last write."""
    memory = LongTermMemory(aredis, ttl_s=600)
    await memory.add("u1", "tutoring", "reflection", "Check the units.")
    key = memory.key("u1", "tutoring", "reflection")
    assert 590 <= redis_client.ttl(key) <= 600
    await LongTermMemory(aredis).add("u2", "tutoring", "reflection", "Kept.")
    assert redis_client.ttl(memory.key("u2", "tutoring", "reflection")) == -1  # no TTL asked
