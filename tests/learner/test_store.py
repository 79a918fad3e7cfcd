import sqlite3
from pathlib import Path

import pytest

from learner.store import TRAINED, CommittedVersion, Store, chunks
from tests.learner.learner_events import feedback, trajectory


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "store.db")
    yield s
    s.close()


def _version(name: str, parent: str = "v0") -> CommittedVersion:
    return CommittedVersion(name, parent, Path("/nowhere") / name, {"version": name}, False)


def test_events_are_idempotent_by_event_id_and_survive_reopening(tmp_path):
    t = trajectory(with_ids=False)
    f = feedback(t.event_id)
    store = Store(tmp_path / "s.db")
    assert store.add_events([t, f]) == 2
    assert store.add_events([t, f]) == 0  # a re-delivery is a no-op
    store.close()
    again = Store(tmp_path / "s.db")
    assert again.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert again.counts() == {"trajectories/open": 1, "feedback/open": 1}
    assert again.open_feedback_for([t.event_id])[t.event_id] == [f]
    again.close()


def test_due_trajectories_have_feedback_or_a_closed_window(store):
    now = 10_000.0
    fresh, old, rated = (trajectory(finished_at=now - s, with_ids=False) for s in (5, 700, 5))
    store.add_events([fresh, old, rated, feedback(rated.event_id)])
    due = {t.event_id for t in store.due_trajectories(now, window_s=600, limit=10)}
    assert due == {old.event_id, rated.event_id}
    assert store.open_counts(now, 600) == {"with_feedback": 1, "window_closed": 1, "waiting": 1}


def test_commit_version_writes_ledger_and_settles_in_one_transaction(store):
    a, b = trajectory(with_ids=False), trajectory(with_ids=False)
    fa = feedback(a.event_id)
    store.add_events([a, b, fa])
    store.commit_version(
        _version("v1"), [a.event_id, fa.event_id], {"untrainable": [b.event_id]}, {"k": {"x": 1}}
    )
    assert store.ledger() == {a.event_id: "v1", fa.event_id: "v1"}
    assert store.counts() == {
        "trajectories/trained": 1,
        "trajectories/untrainable": 1,
        "feedback/trained": 1,
    }
    assert store.get_meta("k") == {"x": 1}
    assert [c.version for c in store.committed_versions()] == ["v1"]


def test_an_event_trained_twice_fails_the_whole_commit(store):
    a = trajectory(with_ids=False)
    store.add_events([a])
    store.commit_version(_version("v1"), [a.event_id])
    with pytest.raises(sqlite3.IntegrityError):
        store.commit_version(_version("v2", "v1"), [a.event_id])
    assert store.ledger() == {a.event_id: "v1"}
    assert [c.version for c in store.committed_versions()] == ["v1"]  # v2 rolled back


def test_orphan_feedback_reports_whether_its_trajectory_is_known(store):
    known = trajectory(with_ids=False)
    late, orphan = feedback(known.event_id), feedback("traj_never_seen")
    store.add_events([known, late, orphan])
    # known is still open, so its feedback waits with it; only the never-seen one is orphan
    assert [(e, k) for e, _, k in store.orphan_feedback()] == [(orphan.event_id, False)]
    store.settle([known.event_id], TRAINED)
    got = {e: k for e, _, k in store.orphan_feedback()}
    assert got == {late.event_id: True, orphan.event_id: False}


def test_chunks_are_consecutive_slices_of_at_most_size():
    assert list(chunks([1, 2, 3, 4, 5], 2)) == [[1, 2], [3, 4], [5]]
    assert list(chunks([1, 2], 0)) == [[1], [2]] and list(chunks([], 3)) == []


def test_forgetting_a_lost_version_reopens_its_events_and_only_those(store):
    """What a rewound registry needs: v2's rows and ledger go, its events train again."""
    runs = [trajectory(with_ids=False) for _ in range(3)]
    store.add_events(runs)
    store.commit_version(_version("v1"), [runs[0].event_id])
    store.commit_version(_version("v2", "v1"), [runs[1].event_id])
    store.settle([runs[2].event_id], "silent")
    assert store.forget_versions(["v2"]) == [runs[1].event_id]
    assert store.ledger() == {runs[0].event_id: "v1"}
    assert [c.version for c in store.committed_versions()] == ["v1"]
    assert store.counts() == {
        "trajectories/trained": 1,
        "trajectories/open": 1,
        "trajectories/silent": 1,  # let go for its own reason: stays let go
    }
