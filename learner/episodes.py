"""Episodes: a trajectory joined with its feedback, and the rule for when it may be trained on.

An episode is trainable as soon as it has explicit feedback, or once its feedback window
(`feedback_window_s` after the run finished) has closed: then it is judged on what it has, or,
with no feedback at all, on `silence_reward`; the default `None` lets silent runs go untrained
(silence in production means "no opinion", not "fine"). Feedback whose trajectory the learner
has never seen is held for a window after it was given, then dropped and counted; feedback that
comes after its episode was trained (or let go) is dropped as `late`. Windows are judged only
once the source has caught up with both streams (the runner's rule), so a window never closes
on feedback still unread in Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agents.events import FeedbackEvent, TrajectoryEvent
from learner.store import Store

SILENT = "silent"
UNKNOWN_TRAJECTORY = "unknown_trajectory"
LATE = "late"


@dataclass(frozen=True)
class Episode:
    """One agent run and every piece of feedback on it so far (oldest first)."""

    trajectory: TrajectoryEvent
    feedback: tuple[FeedbackEvent, ...] = ()

    @property
    def event_ids(self) -> list[str]:
        """The ids the ledger records when this episode is trained on."""
        return [self.trajectory.event_id] + [f.event_id for f in self.feedback]


class Readiness(StrEnum):
    TRAINABLE = "trainable"
    WAITING = "waiting"  # window open, no feedback yet
    SILENT = "silent"  # window closed, no feedback, no silence reward: let go


def readiness(
    episode: Episode, now: float, window_s: float, silence_reward: float | None
) -> Readiness:
    """Whether an episode may be trained on now (pure)."""
    if episode.feedback:
        return Readiness.TRAINABLE
    if now < episode.trajectory.finished_at + window_s:
        return Readiness.WAITING
    return Readiness.SILENT if silence_reward is None else Readiness.TRAINABLE


@dataclass(frozen=True)
class Settled:
    """Events let go by one `settle` pass, counted by reason."""

    silent: int = 0
    unknown_trajectory: int = 0
    late: int = 0


def settle(
    store: Store,
    now: float,
    window_s: float,
    silence_reward: float | None,
    keep_silent: bool = False,
) -> Settled:
    """Let go of silent episodes (unless `keep_silent`: a reward model may score them), orphan
    feedback past its window, and late feedback."""
    silent = (
        []
        if keep_silent
        else [e.trajectory.event_id for e in silent_episodes(store, now, window_s, silence_reward)]
    )
    unknown, late = [], []
    for event_id, created_at, known in store.orphan_feedback():
        if known:
            late.append(event_id)
        elif now >= created_at + window_s:
            unknown.append(event_id)
    for ids, reason in ((silent, SILENT), (unknown, UNKNOWN_TRAJECTORY), (late, LATE)):
        if ids:
            store.settle(ids, reason)
    return Settled(len(silent), len(unknown), len(late))


def due_episodes(store: Store, now: float, window_s: float, limit: int) -> list[Episode]:
    """Open episodes with feedback or a closed window (the others wait), oldest first."""
    trajectories = store.due_trajectories(now, window_s, limit)
    feedback = store.open_feedback_for([t.event_id for t in trajectories])
    return [Episode(t, tuple(feedback[t.event_id])) for t in trajectories]


def silent_episodes(
    store: Store, now: float, window_s: float, silence_reward: float | None, limit: int = 100_000
) -> list[Episode]:
    """Episodes whose window closed with no feedback and no silence reward, oldest first."""
    due = due_episodes(store, now, window_s, limit)
    return [e for e in due if readiness(e, now, window_s, silence_reward) is Readiness.SILENT]


def trainable_episodes(
    store: Store, now: float, window_s: float, silence_reward: float | None, limit: int
) -> list[Episode]:
    """Up to `limit` episodes that may be trained on now, oldest first."""
    due = due_episodes(store, now, window_s, limit)
    return [e for e in due if readiness(e, now, window_s, silence_reward) is Readiness.TRAINABLE]
