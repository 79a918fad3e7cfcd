import pytest

from agents.events import (
    LEARNER_GROUP,
    STREAM_DEAD,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    encode,
)
from learner.store import Store
from learner.trajectory_source import TrajectorySource
from tests.learner.learner_events import feedback, trajectory, xadd


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.db")
    yield s
    s.close()


def _source(redis_client, store, consumer="learner-1", **kw) -> TrajectorySource:
    kw.setdefault("block_ms", 10)
    source = TrajectorySource(redis_client, store, consumer, **kw)
    source.ensure_groups()
    return source


def _drain(source: TrajectorySource) -> list:
    results = [source.poll()]
    while not results[-1].caught_up:
        results.append(source.poll())
    return results


def test_events_are_persisted_then_acknowledged_once(redis_client, store):
    source = _source(redis_client, store)
    t = trajectory(with_ids=False)
    xadd(redis_client, t)
    xadd(redis_client, feedback(t.event_id))
    xadd(redis_client, t)  # the agent API retried the same event
    results = _drain(source)
    assert sum(r.new for r in results) == 2 and sum(r.duplicates for r in results) == 1
    assert store.counts() == {"trajectories/open": 1, "feedback/open": 1}
    assert source.pending() == 0
    source.ensure_groups()  # idempotent: BUSYGROUP is not an error


def test_bad_entries_go_to_the_dead_letter_stream_and_the_source_keeps_going(redis_client, store):
    source = _source(redis_client, store)
    t = trajectory(with_ids=False)
    bad = [
        {"type": "TrajectoryEvent", "schema_version": "1", "event_id": "x", "data": "{not json"},
        {"foo": "bar"},
        {**encode(feedback(t.event_id)), "schema_version": "99"},
    ]
    for fields in bad:
        redis_client.xadd(STREAM_TRAJECTORIES, fields)
    redis_client.xadd(STREAM_TRAJECTORIES, encode(feedback(t.event_id)))  # wrong stream
    xadd(redis_client, t)
    results = _drain(source)
    reasons = [d.reason for r in results for d in r.dead]
    assert len(reasons) == 4
    assert "does not parse" in reasons[0] and "unknown event type" in reasons[1]
    assert "schema_version" in reasons[2] and "does not belong on" in reasons[3]
    dead = redis_client.xrange(STREAM_DEAD)
    assert dead[1][1][b"foo"] == b"bar"  # the original fields travel with the reason
    assert dead[1][1][b"dead_stream"] == STREAM_TRAJECTORIES.encode()
    assert store.counts() == {"trajectories/open": 1}
    assert source.pending() == 0 and source.dead_total == 4


def test_own_pending_entries_are_read_again_after_a_restart(redis_client, store):
    first_life = _source(redis_client, store)
    xadd(redis_client, trajectory(with_ids=False))
    # The previous life of learner-1 read the entry and died before persisting it.
    redis_client.xreadgroup(LEARNER_GROUP, "learner-1", {STREAM_TRAJECTORIES: ">"})
    assert store.counts() == {} and first_life.pending() == 1
    source = _source(redis_client, store, claim_idle_ms=3_600_000)  # no reclaim needed
    _drain(source)
    assert store.counts() == {"trajectories/open": 1} and source.pending() == 0


def test_a_dead_consumers_entries_are_reclaimed(redis_client, store):
    t = trajectory(with_ids=False)
    _source(redis_client, store)
    xadd(redis_client, t)
    redis_client.xreadgroup(LEARNER_GROUP, "learner-dead", {STREAM_TRAJECTORIES: ">"})
    source = _source(redis_client, store, claim_idle_ms=3_600_000)
    _drain(source)
    assert store.counts() == {} and source.pending() == 1  # not idle long enough yet
    source = _source(redis_client, store, consumer="learner-2", claim_idle_ms=0)
    _drain(source)
    assert store.counts() == {"trajectories/open": 1} and source.pending() == 0


def test_an_entry_delivered_too_often_is_dead_lettered(redis_client, store):
    _source(redis_client, store)
    entry_id = xadd(redis_client, trajectory(with_ids=False))
    redis_client.xreadgroup(LEARNER_GROUP, "crashy", {STREAM_TRAJECTORIES: ">"})
    for _ in range(4):  # a consumer that crashed on it five times (restarts re-read its PEL)
        redis_client.xreadgroup(LEARNER_GROUP, "crashy", {STREAM_TRAJECTORIES: "0"})
    source = _source(redis_client, store, consumer="learner-2", claim_idle_ms=0, max_deliveries=5)
    results = _drain(source)
    dead = [d for r in results for d in r.dead]
    assert [d.entry_id for d in dead] == [entry_id]
    assert "delivered 6 times" in dead[0].reason
    assert store.counts() == {} and source.pending() == 0


def test_an_entry_deleted_while_pending_is_acknowledged(redis_client, store):
    _source(redis_client, store)
    entry_id = xadd(redis_client, trajectory(with_ids=False))
    redis_client.xreadgroup(LEARNER_GROUP, "learner-1", {STREAM_TRAJECTORIES: ">"})
    redis_client.xdel(STREAM_TRAJECTORIES, entry_id)
    source = _source(redis_client, store)
    _drain(source)
    assert source.pending() == 0 and redis_client.xlen(STREAM_DEAD) == 0


def test_trim_keeps_what_any_group_has_not_acknowledged(redis_client, store):
    source = _source(redis_client, store)
    redis_client.xgroup_create(STREAM_FEEDBACK, "audit", id="0")
    ids = [xadd(redis_client, feedback(f"traj_{i}")) for i in range(4)]
    _drain(source)  # the learner has acknowledged all four
    got = redis_client.xreadgroup("audit", "a1", {STREAM_FEEDBACK: ">"}, count=2)
    redis_client.xack(STREAM_FEEDBACK, "audit", got[0][1][0][0])  # audit acked 1, holds 2
    assert source.trim()[STREAM_FEEDBACK] == 1
    assert [i.decode() for i, _ in redis_client.xrange(STREAM_FEEDBACK)] == ids[1:]
    redis_client.xack(STREAM_FEEDBACK, "audit", ids[1])
    assert source.trim()[STREAM_FEEDBACK] == 1  # audit has delivered up to ids[1] only
    rest = redis_client.xreadgroup("audit", "a1", {STREAM_FEEDBACK: ">"})
    redis_client.xack(STREAM_FEEDBACK, "audit", *[i for i, _ in rest[0][1]])
    assert source.trim()[STREAM_FEEDBACK] == 2
    assert redis_client.xlen(STREAM_FEEDBACK) == 0


def test_an_erased_user_leaves_the_store_and_a_later_request_is_kept(redis_client, store):
    """Issue 36: `agents.erasure` asks the learner to erase its copy; the source does it after
    a poll and drops the request, unless the request was made again meanwhile."""
    from agents.events import FORGET_REQUESTS

    source = _source(redis_client, store)
    gone, kept = trajectory(user="u_gone"), trajectory(user="u_kept")
    for t in (gone, kept):
        xadd(redis_client, t)
        xadd(redis_client, feedback(t.event_id, user=t.user_id))
    _drain(source)
    assert store.counts() == {"trajectories/open": 2, "feedback/open": 2}
    redis_client.hset(FORGET_REQUESTS, "u_gone", "1.0")
    assert source.forget() == 2  # the run and its feedback
    assert store.counts() == {"trajectories/open": 1, "feedback/open": 1}
    assert store.has_event(kept.event_id) and not store.has_event(gone.event_id)
    assert redis_client.hlen(FORGET_REQUESTS) == 0
    assert source.forget() == 0  # nothing asked: no work

    redis_client.hset(FORGET_REQUESTS, "u_kept", "2.0")
    asked_again = source._drop_request  # the request is renewed while the store erases

    def renewed(keys, args):
        redis_client.hset(FORGET_REQUESTS, "u_kept", "3.0")
        return asked_again(keys=keys, args=args)

    source._drop_request = renewed
    source.forget()
    assert redis_client.hget(FORGET_REQUESTS, "u_kept") == b"3.0"  # kept for the next poll
