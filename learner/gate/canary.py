"""The canary controller: live feedback on `candidate` vs `champion`, promote or roll back by itself.

The agent side sends a share of new threads to `candidate` (ARLOOP_CANARY_SHARE on the agent
API). Each check reads, from the learner's store, every run either version served since the
canary started that got feedback, scores it as the learner would (mean feedback score in
[-1, 1]) and asks `learner.gate.stats.sequential_compare`, a confidence sequence valid however often
it is checked: roll back as soon as the candidate is worse with confidence, promote once both
arms have enough runs and the candidate is not worse than `margin`. A canary that has not
concluded after `timeout_s` is rolled back (the champion stays: no evidence is no promotion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from learner.gate.release import end_canary, promote
from learner.gate.stats import SequentialDecision, sequential_compare
from learner.policy.registry import CANDIDATE, CHAMPION, PolicyRegistry
from learner.rewards import episode_reward, scored
from learner.store import Store

PROMOTE, ROLLBACK, CONTINUE, TIMEOUT = "promote", "rollback", "continue", "timeout"


class CanaryConfig(BaseModel):
    """Whether a passing version goes out as a canary, and when the controller decides
    (`ARLOOP_CANARY__<FIELD>` in the learner's settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """After a pass, the version becomes `candidate` and serves the agent side's canary share
    (ARLOOP_CANARY_SHARE on the agent API); false promotes it to champion at once."""
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    """Error level of the always-valid interval on the reward difference."""
    margin: float = 0.1
    """Promote when the candidate is, with confidence, no worse than this (rewards in [-1, 1])."""
    min_per_arm: int = Field(30, ge=1)
    """Runs with feedback each arm needs before a promotion."""
    timeout_s: float = Field(24 * 3600.0, gt=0.0)
    """A canary still undecided this long after it started is rolled back."""
    max_runs: int = Field(100_000, ge=1)
    """Most recent runs read per check."""
    check_s: float = Field(10.0, gt=0.0)
    """How often the learner checks the canary (and retries a gate that could not judge)."""


@dataclass(frozen=True)
class CanaryCheck:
    """Where the canary stands, and what the controller will do about it."""

    candidate: str
    champion: str
    started_at: float
    decision: SequentialDecision
    action: str  # promote | rollback | continue | timeout

    def line(self) -> str:
        d = self.decision
        return (
            f"canary {self.candidate} vs {self.champion}: {d.n_candidate} vs {d.n_champion} runs "
            f"with feedback, reward diff {d.diff:+.3f} (always-valid CI {d.ci_low:+.3f}.."
            f"{d.ci_high:+.3f}) -> {self.action}"
        )


def arm_rewards(
    store: Store, champion: str, candidate: str, since: float, limit: int
) -> tuple[list[float], list[float]]:
    """(champion rewards, candidate rewards): one per run with feedback since `since`."""
    arms: dict[str, list[float]] = {champion: [], candidate: []}
    for t, feedback in store.rewarded_runs(
        since=since, limit=limit, versions=[champion, candidate]
    ):
        reward = episode_reward(scored(feedback), [s.index for s in t.model_steps]).reward
        if reward is not None and t.policy_version in arms:
            arms[t.policy_version].append(reward)
    return arms[champion], arms[candidate]


def check(
    store: Store, registry: PolicyRegistry, config: CanaryConfig, now: float | None = None
) -> CanaryCheck | None:
    """The canary's state now; None when no candidate is out."""
    aliases = registry.aliases()
    candidate, champion = aliases.get(CANDIDATE), aliases.get(CHAMPION)
    if candidate is None or champion is None:
        return None
    started = canary_started_at(registry, candidate)
    base, cand = arm_rewards(store, champion, candidate, started, config.max_runs)
    decision = sequential_compare(
        base,
        cand,
        alpha=config.alpha,
        margin=config.margin,
        min_per_arm=config.min_per_arm,
        scale=2.0,
    )
    action = decision.verdict
    now = time.time() if now is None else now
    if action == CONTINUE and now - started > config.timeout_s:
        action = TIMEOUT
    return CanaryCheck(candidate, champion, started, decision, action)


def act(registry: PolicyRegistry, c: CanaryCheck, actor: str) -> str:
    """Carry out a check's decision (AliasConflict if someone moved the aliases meanwhile)."""
    if c.action == PROMOTE:
        promote(registry, c.candidate, actor=actor, reason=f"canary won: {_why(c)}")
    elif c.action == ROLLBACK:
        end_canary(registry, c.candidate, actor=actor, reason=f"canary lost: {_why(c)}")
    elif c.action == TIMEOUT:
        end_canary(registry, c.candidate, actor=actor, reason=f"canary undecided: {_why(c)}")
    return c.line()


def canary_started_at(registry: PolicyRegistry, candidate: str) -> float:
    """When the version became the candidate (stored with its gate report), else its creation."""
    record = registry.get(candidate)
    started = (record.report or {}).get("canary", {}).get("started_at")
    return float(started) if started is not None else record.created_at


def _why(c: CanaryCheck) -> str:
    d = c.decision
    return (
        f"reward diff {d.diff:+.3f}, CI {d.ci_low:+.3f}..{d.ci_high:+.3f} on "
        f"{d.n_candidate}/{d.n_champion} runs"
    )
