"""What a pack is: agents, the tasks its users bring (train and held-out eval), and a verifier."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agents.events import ModelStep
from agents.runtime import AgentSpec

Split = Literal["train", "eval"]
ScoreReward = Callable[[str, float], float | None]
"""A pack's reading of a named score: (key, score) -> reward in [-1, 1], or None."""


def default_score_reward(key: str, score: float) -> float | None:
    """A named score in [0, 1] as the reward 2s - 1 (as an outcome); a score on another scale
    is the pack's to read (`Pack.score_reward`): None, not learned from."""
    return 2.0 * score - 1.0 if 0.0 <= score <= 1.0 else None


@dataclass(frozen=True)
class Task:
    """One task for an agent, with what counts as solved (never shown to the agent)."""

    id: str
    agent: str
    input: str
    reference: str
    """What the verifier compares against: a number, a triage level, ..."""
    needs_tool: str | None = None
    """The tool a good answer uses (for the tool-use guard), if any."""
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Pack:
    """A deployable domain: its agents, its task sets and its answer verifier."""

    name: str
    agents: tuple[AgentSpec, ...]
    tasks: Callable[[Split], list[Task]]
    """`tasks("train")` for simulated users, `tasks("eval")` the held-out pool (disjoint from
    training; the eval gate draws from it, stratified by `Task.meta["kind"]`)."""
    verify: Callable[[Task, str], float]
    """Score a final answer for a task in [0, 1] (1 = solved)."""
    answer_of: Callable[[str], str | None] | None = None
    """The final answer a reply states, normalised so equal answers are equal strings (`30`,
    `urgent`); None when the reply states none. With it the learner turns feedback into labels
    and checks the runs it resamples (`learner.labels`); a pack without it is learned from by
    its feedback alone."""
    reference_from: Callable[[str], str | None] | None = None
    """The answer a user's correction states (`it's 30`, `this was urgent`), normalised as
    `answer_of`'s; None: the correction's text is read with `answer_of`."""
    score_reward: ScoreReward = default_score_reward
    """How a named score (`{"key": "helpfulness", "score": 4}` on `POST /v1/feedback`) becomes
    a reward in [-1, 1] (None: not learned from); read when the feedback arrives."""
    first_turn: Callable[[Task, ModelStep], float] | None = None
    """Score an agent's first model call alone in [0, 1] (the tutor: does its calculator call
    compute the answer): the cheap form of an eval run that the gate's sampled test uses,
    checked against full runs in every gate report. None: the gate runs whole episodes."""
