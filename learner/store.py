"""The learner's durable store: SQLite (WAL) in the data directory, the source of exactly-once.

Tables:
  trajectories  event_id, user_id, finished_at, received_at, settled, data (the event JSON)
  feedback      event_id, trajectory_id, created_at, received_at, settled, data
  ledger        event_id -> version that trained on it (committed with that version's checkpoint)
  versions      version, parent, checkpoint path, manifest JSON, registered (0 until in Redis)
  meta          key -> JSON value (e.g. the running reward baseline, committed with the ledger)

`settled` is NULL while an event may still be trained on, `trained` once it is in the ledger,
else the reason it was let go (`silent`, `unknown_trajectory`, `late`, `untrainable`, `no_token_ids`,
`cancelled`: a run whose client left midway is settled as it arrives).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from agents.events import FeedbackEvent, RunStatus, TrajectoryEvent

T = TypeVar("T")

TRAINED = "trained"
CANCELLED = "cancelled"  # a run its client left midway: stored, settled on arrival

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trajectories (
  event_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, finished_at REAL NOT NULL,
  received_at REAL NOT NULL, settled TEXT, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trajectories_open ON trajectories(finished_at) WHERE settled IS NULL;
CREATE TABLE IF NOT EXISTS feedback (
  event_id TEXT PRIMARY KEY, trajectory_id TEXT NOT NULL, created_at REAL NOT NULL,
  received_at REAL NOT NULL, settled TEXT, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS feedback_by_trajectory ON feedback(trajectory_id);
CREATE INDEX IF NOT EXISTS feedback_open ON feedback(created_at) WHERE settled IS NULL;
CREATE TABLE IF NOT EXISTS ledger (
  event_id TEXT PRIMARY KEY, version TEXT NOT NULL, trained_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
  version TEXT PRIMARY KEY, parent TEXT, checkpoint TEXT NOT NULL, manifest TEXT NOT NULL,
  registered INTEGER NOT NULL DEFAULT 0, committed_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_HAS_FEEDBACK = (
    "EXISTS (SELECT 1 FROM feedback f WHERE f.trajectory_id = t.event_id AND f.settled IS NULL)"
)
_DUE = f"t.settled IS NULL AND ({_HAS_FEEDBACK} OR t.finished_at <= ?)"
_HAS_ANY_FEEDBACK = "EXISTS (SELECT 1 FROM feedback f WHERE f.trajectory_id = t.event_id)"


@dataclass(frozen=True)
class CommittedVersion:
    """A version whose checkpoint and ledger are committed (maybe not yet in the registry)."""

    version: str
    parent: str | None
    checkpoint: Path
    manifest: dict[str, Any]
    registered: bool


class Store:
    """One SQLite file; every write is one transaction, synchronous=FULL so a commit survives."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- writes from the source -------------------------------------------------------------

    def add_events(self, events: Sequence[TrajectoryEvent | FeedbackEvent]) -> int:
        """Persist a batch in one transaction, idempotent by event_id; returns how many were new."""
        now = time.time()
        new = 0
        with self.transaction() as db:
            for e in events:
                new += db.execute(*_insert(e, now)).rowcount
        return new

    def forget_users(self, users: Sequence[str]) -> int:
        """Delete the runs of these stored user ids and all feedback on them or from them (a
        user's erasure, `agents.erasure`); the ledger keeps its event ids, so nothing counts
        twice. Returns the rows deleted."""
        deleted = 0
        with self.transaction() as db:
            for chunk in chunks(list(users), 500):
                marks = _marks(chunk)
                runs = f"SELECT event_id FROM trajectories WHERE user_id IN ({marks})"
                deleted += db.execute(
                    f"DELETE FROM feedback WHERE trajectory_id IN ({runs}) "
                    f"OR json_extract(data, '$.user_id') IN ({marks})",
                    chunk + chunk,
                ).rowcount
                deleted += db.execute(
                    f"DELETE FROM trajectories WHERE user_id IN ({marks})", chunk
                ).rowcount
        return deleted

    # -- reads for episodes ----------------------------------------------------------------

    def due_trajectories(self, now: float, window_s: float, limit: int) -> list[TrajectoryEvent]:
        """Open trajectories with open feedback or a closed feedback window, oldest first."""
        rows = self.db.execute(
            f"SELECT t.data FROM trajectories t WHERE {_DUE} ORDER BY t.finished_at, t.event_id LIMIT ?",
            (now - window_s, limit),
        ).fetchall()
        return [TrajectoryEvent.model_validate_json(r[0]) for r in rows]

    def open_counts(self, now: float, window_s: float) -> dict[str, int]:
        """Open trajectories: `with_feedback`, `window_closed` (no feedback), `waiting`."""
        row = self.db.execute(
            f"SELECT COALESCE(SUM({_HAS_FEEDBACK}), 0), "
            f"COALESCE(SUM(NOT {_HAS_FEEDBACK} AND t.finished_at <= ?), 0), COUNT(*) "
            "FROM trajectories t WHERE t.settled IS NULL",
            (now - window_s,),
        ).fetchone()
        return {
            "with_feedback": row[0],
            "window_closed": row[1],
            "waiting": row[2] - row[0] - row[1],
        }

    def open_feedback_for(self, trajectory_ids: Sequence[str]) -> dict[str, list[FeedbackEvent]]:
        """Open feedback grouped by trajectory id, oldest first."""
        out: dict[str, list[FeedbackEvent]] = {t: [] for t in trajectory_ids}
        for chunk in chunks(list(trajectory_ids), 500):
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT data FROM feedback WHERE settled IS NULL AND trajectory_id IN ({marks}) "
                "ORDER BY created_at, event_id",
                chunk,
            ).fetchall()
            for (data,) in rows:
                f = FeedbackEvent.model_validate_json(data)
                out[f.trajectory_id].append(f)
        return out

    def orphan_feedback(self) -> list[tuple[str, float, bool]]:
        """Open feedback whose trajectory is not open: (event_id, created_at, trajectory known)."""
        rows = self.db.execute(
            "SELECT f.event_id, f.created_at, t.event_id IS NOT NULL FROM feedback f "
            "LEFT JOIN trajectories t ON t.event_id = f.trajectory_id "
            "WHERE f.settled IS NULL AND (t.event_id IS NULL OR t.settled IS NOT NULL)"
        ).fetchall()
        return [(r[0], r[1], bool(r[2])) for r in rows]

    def settle(self, event_ids: Iterable[str], reason: str) -> None:
        """Let events go without training (reason: silent, unknown_trajectory, late, untrainable,
        no_token_ids)."""
        with self.transaction() as db:
            _mark(db, list(event_ids), reason)

    # -- the ledger, committed with a checkpoint -------------------------------------------

    def commit_version(
        self,
        version: CommittedVersion,
        trained: Sequence[str],
        let_go: dict[str, Sequence[str]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """One transaction: the version row, its ledger, events let go, and meta state.

        A plain INSERT into the ledger: an event trained twice fails the whole commit.
        """
        now = time.time()
        with self.transaction() as db:
            db.execute(
                "INSERT INTO versions VALUES (?,?,?,?,0,?)",
                (
                    version.version,
                    version.parent,
                    str(version.checkpoint),
                    json.dumps(version.manifest),
                    now,
                ),
            )
            db.executemany(
                "INSERT INTO ledger VALUES (?,?,?)", [(e, version.version, now) for e in trained]
            )
            _mark(db, list(trained), TRAINED)
            for reason, ids in (let_go or {}).items():
                _mark(db, list(ids), reason)
            for key, value in (meta or {}).items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, json.dumps(value)))

    def forget_versions(self, versions: Sequence[str]) -> list[str]:
        """Versions that no longer exist (the registry lost them): their rows and ledger go,
        and the events they trained on are open again, in one transaction; returns those ids."""
        marks = _marks(versions)
        with self.transaction() as db:
            ids = [
                r[0]
                for r in db.execute(
                    f"SELECT event_id FROM ledger WHERE version IN ({marks})", list(versions)
                ).fetchall()
            ]
            db.execute(f"DELETE FROM ledger WHERE version IN ({marks})", list(versions))
            db.execute(f"DELETE FROM versions WHERE version IN ({marks})", list(versions))
            for table in ("trajectories", "feedback"):
                db.executemany(
                    f"UPDATE {table} SET settled = NULL WHERE event_id = ? AND settled = ?",
                    [(i, TRAINED) for i in ids],
                )
        return ids

    def mark_registered(self, version: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE versions SET registered = 1 WHERE version = ?", (version,))

    def committed_versions(self) -> list[CommittedVersion]:
        rows = self.db.execute(
            "SELECT version, parent, checkpoint, manifest, registered FROM versions "
            "ORDER BY committed_at"
        ).fetchall()
        return [
            CommittedVersion(r[0], r[1], Path(r[2]), json.loads(r[3]), bool(r[4])) for r in rows
        ]

    def ledger(self) -> dict[str, str]:
        """Every trained event id -> the version that learned from it."""
        return dict(self.db.execute("SELECT event_id, version FROM ledger").fetchall())

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # -- reads for release control (eval gate, off-policy estimate, canary) -----------------

    def trained_runs(self, version: str) -> list[tuple[TrajectoryEvent, list[FeedbackEvent]]]:
        """The trajectories `version` learned from (its ledger), each with all its feedback."""
        rows = self.db.execute(
            "SELECT t.data FROM ledger l JOIN trajectories t ON t.event_id = l.event_id "
            "WHERE l.version = ? ORDER BY t.finished_at, t.event_id",
            (version,),
        ).fetchall()
        return self._with_feedback([TrajectoryEvent.model_validate_json(r[0]) for r in rows])

    def rewarded_runs(
        self,
        *,
        since: float = 0.0,
        limit: int = 512,
        versions: Sequence[str] | None = None,
        not_trained_by: str | None = None,
    ) -> list[tuple[TrajectoryEvent, list[FeedbackEvent]]]:
        """Runs finished since `since` that got feedback (trained or not), newest first.

        `versions` keeps runs served by those policy versions; `not_trained_by` leaves out
        what that version learned from (held-out logged traffic).
        """
        where, args = ["t.finished_at >= ?", _HAS_ANY_FEEDBACK], [since]
        if versions is not None:
            where.append(f"json_extract(t.data, '$.policy_version') IN ({_marks(versions)})")
            args += list(versions)
        if not_trained_by is not None:
            where.append(
                "NOT EXISTS (SELECT 1 FROM ledger l WHERE l.event_id = t.event_id "
                "AND l.version = ?)"
            )
            args.append(not_trained_by)
        rows = self.db.execute(
            f"SELECT t.data FROM trajectories t WHERE {' AND '.join(where)} "
            "ORDER BY t.finished_at DESC, t.event_id LIMIT ?",
            (*args, limit),
        ).fetchall()
        return self._with_feedback([TrajectoryEvent.model_validate_json(r[0]) for r in rows])

    def _with_feedback(
        self, trajectories: list[TrajectoryEvent]
    ) -> list[tuple[TrajectoryEvent, list[FeedbackEvent]]]:
        by_id: dict[str, list[FeedbackEvent]] = {t.event_id: [] for t in trajectories}
        for chunk in chunks(list(by_id), 500):
            rows = self.db.execute(
                f"SELECT data FROM feedback WHERE trajectory_id IN ({_marks(chunk)}) "
                "ORDER BY created_at, event_id",
                chunk,
            ).fetchall()
            for (data,) in rows:
                f = FeedbackEvent.model_validate_json(data)
                by_id[f.trajectory_id].append(f)
        return [(t, by_id[t.event_id]) for t in trajectories]

    # -- figures for the display -----------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Open and settled events by table and reason: trajectories/open, feedback/late, ..."""
        out: dict[str, int] = {}
        for table in ("trajectories", "feedback"):
            rows = self.db.execute(
                f"SELECT COALESCE(settled, 'open'), COUNT(*) FROM {table} GROUP BY 1"
            ).fetchall()
            out.update({f"{table}/{state}": n for state, n in rows})
        return out

    def has_event(self, event_id: str) -> bool:
        return any(
            self.db.execute(f"SELECT 1 FROM {t} WHERE event_id = ?", (event_id,)).fetchone()
            for t in ("trajectories", "feedback")
        )


def _insert(e: TrajectoryEvent | FeedbackEvent, now: float) -> tuple[str, tuple]:
    if isinstance(e, TrajectoryEvent):
        # a run its client abandoned midway is kept, but settled at once: never trained on
        settled = CANCELLED if e.status is RunStatus.CANCELLED else None
        return (
            "INSERT OR IGNORE INTO trajectories VALUES (?,?,?,?,?,?)",
            (e.event_id, e.user_id, e.finished_at, now, settled, e.model_dump_json()),
        )
    return (
        "INSERT OR IGNORE INTO feedback VALUES (?,?,?,?,NULL,?)",
        (e.event_id, e.trajectory_id, e.created_at, now, e.model_dump_json()),
    )


def _mark(db: sqlite3.Connection, ids: list[str], state: str) -> None:
    for table in ("trajectories", "feedback"):
        db.executemany(
            f"UPDATE {table} SET settled = ? WHERE event_id = ? AND settled IS NULL",
            [(state, i) for i in ids],
        )


def _marks(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


def chunks(items: list[T], size: int) -> Iterator[list[T]]:
    """Consecutive slices of at most `size` (>= 1) items: `itertools.batched`, which 3.11 lacks."""
    size = max(1, size)
    for i in range(0, len(items), size):
        yield items[i : i + size]


def even_chunks(items: list[T], size: int) -> list[list[T]]:
    """The fewest slices of at most `size` items, their lengths within one of each other.

    13 samples at 8 a step are 7 + 6, not 8 + 5: each optimiser step then weighs its samples
    about equally, where a small last slice would move the weights as far on five as on eight.
    """
    if not items:
        return []
    count = -(-len(items) // max(1, size))  # ceil
    base, extra = divmod(len(items), count)
    out, at = [], 0
    for k in range(count):
        step = base + (1 if k < extra else 0)
        out.append(items[at : at + step])
        at += step
    return out
