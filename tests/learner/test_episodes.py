import pytest

from learner.episodes import (
    Episode,
    Readiness,
    Settled,
    readiness,
    settle,
    trainable_episodes,
)
from learner.store import TRAINED, Store
from learner.trajectory_source import TrajectorySource
from tests.learner.learner_events import feedback, trajectory, xadd

WINDOW = 600.0
NOW = 1_000_000.0


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.db")
    yield s
    s.close()


def test_readiness_rule():
    fresh = trajectory(finished_at=NOW - 10, with_ids=False)
    old = trajectory(finished_at=NOW - WINDOW, with_ids=False)
    rated = Episode(fresh, (feedback(fresh.event_id),))
    assert readiness(rated, NOW, WINDOW, None) is Readiness.TRAINABLE  # feedback: at once
    assert readiness(Episode(fresh), NOW, WINDOW, None) is Readiness.WAITING
    assert readiness(Episode(old), NOW, WINDOW, None) is Readiness.SILENT  # window closed
    assert readiness(Episode(old), NOW, WINDOW, 0.0) is Readiness.TRAINABLE  # silence counts 0


def test_trainable_episodes_join_feedback_oldest_first(store):
    a = trajectory(finished_at=NOW - 20, with_ids=False)
    b = trajectory(finished_at=NOW - 10, with_ids=False)
    waiting = trajectory(finished_at=NOW - 5, with_ids=False)
    fa1, fa2 = feedback(a.event_id, created_at=NOW - 3), feedback(a.event_id, created_at=NOW - 2)
    fb = feedback(b.event_id, "rating", 4, created_at=NOW - 1)
    store.add_events([waiting, b, a, fa2, fb, fa1])
    got = trainable_episodes(store, NOW, WINDOW, None, limit=10)
    assert [e.trajectory.event_id for e in got] == [a.event_id, b.event_id]
    assert got[0].feedback == (fa1, fa2) and got[1].feedback == (fb,)
    assert got[0].event_ids == [a.event_id, fa1.event_id, fa2.event_id]
    assert len(trainable_episodes(store, NOW, WINDOW, None, limit=1)) == 1


def test_silent_episodes_are_let_go_when_silence_has_no_reward(store):
    old = trajectory(finished_at=NOW - WINDOW - 1, with_ids=False)
    fresh = trajectory(finished_at=NOW - 1, with_ids=False)
    store.add_events([old, fresh])
    assert settle(store, NOW, WINDOW, None) == Settled(silent=1)
    assert store.counts() == {"trajectories/silent": 1, "trajectories/open": 1}
    assert trainable_episodes(store, NOW, WINDOW, None, 10) == []


def test_feedback_for_an_unknown_trajectory_is_held_then_dropped_and_counted(redis_client, store):
    source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
    source.ensure_groups()
    given_at = NOW - 100
    arrives_later = trajectory(finished_at=given_at - 1, with_ids=False)
    on_time = feedback(arrives_later.event_id, created_at=given_at)
    orphan = feedback("traj_that_never_comes", created_at=given_at)
    for f in (on_time, orphan):
        xadd(redis_client, f)
    while not source.poll().caught_up:
        pass
    assert settle(store, NOW, WINDOW, None) == Settled()  # both held: the window is open
    xadd(redis_client, arrives_later)  # its trajectory shows up late: the feedback joins it
    while not source.poll().caught_up:
        pass
    eps = trainable_episodes(store, NOW, WINDOW, None, 10)
    assert [e.feedback for e in eps] == [(on_time,)]
    assert settle(store, given_at + WINDOW, WINDOW, None) == Settled(unknown_trajectory=1)
    assert store.counts()["feedback/unknown_trajectory"] == 1
    assert store.counts()["feedback/open"] == 1  # on_time still waits for its round


def test_feedback_after_the_episode_was_trained_is_dropped_as_late(store):
    t = trajectory(finished_at=NOW - 10, with_ids=False)
    store.add_events([t, feedback(t.event_id)])
    store.settle(
        [e for e in trainable_episodes(store, NOW, WINDOW, None, 10)[0].event_ids], TRAINED
    )
    store.add_events([feedback(t.event_id, "rating", 1)])
    assert settle(store, NOW, WINDOW, None) == Settled(late=1)
    assert store.counts()["feedback/late"] == 1
