"""The canary controller on live feedback in the learner's store: promote, roll back, wait, time out."""

import time

import pytest

from agents.events import PolicyAliasMoved, PolicyRolledBack
from learner.gate.canary import (
    CONTINUE,
    PROMOTE,
    ROLLBACK,
    TIMEOUT,
    CanaryConfig,
    act,
    arm_rewards,
    check,
)
from learner.gate.eval_gate import GateReport
from learner.gate.release import apply_verdict
from learner.policy.registry import CANDIDATE, CHAMPION, VersionStatus
from tests.learner.gate.release_support import add_version, log_arm

CONFIG = CanaryConfig(min_per_arm=30, margin=0.1)


def _canary(registry, tmp_path) -> str:
    """A version that passed the gate and went out as the candidate."""
    v = add_version(registry, tmp_path / "ck")
    passed = GateReport(v, "v0", "pass", [], "fine")
    assert "candidate" in apply_verdict(registry, passed, canary=True, actor="learner-1")
    return v


def test_a_candidate_as_good_as_the_champion_is_promoted(registry, store, tmp_path):
    v = _canary(registry, tmp_path)
    log_arm(store, "v0", 15, 15)
    log_arm(store, v, 25, 5)
    early = check(store, registry, CONFIG)
    assert early.action == CONTINUE  # 30 runs a side cannot yet rule out "worse by 0.1"
    log_arm(store, "v0", 15, 15)
    log_arm(store, v, 25, 5)
    c = check(store, registry, CONFIG)
    assert c.action == PROMOTE and (c.decision.n_champion, c.decision.n_candidate) == (60, 60)
    assert c.decision.diff == pytest.approx(2 / 3) and c.decision.ci_low > -CONFIG.margin
    act(registry, c, "learner-1")
    assert registry.aliases() == {CHAMPION: v}
    assert registry.get(v).status is VersionStatus.CHAMPION
    assert registry.get("v0").status is VersionStatus.RETIRED
    moves = [e for e in registry.history() if isinstance(e, PolicyAliasMoved)]
    assert [(m.alias, m.version) for m in moves[-3:]] == [
        (CANDIDATE, v),
        (CHAMPION, v),
        (CANDIDATE, None),
    ]
    assert "canary won" in moves[-2].reason


def test_a_worse_candidate_is_rolled_back_early_and_the_champion_stays(registry, store, tmp_path):
    v = _canary(registry, tmp_path)
    log_arm(store, "v0", 18, 2)
    log_arm(store, v, 2, 18)  # far fewer than min_per_arm: rollback needs no minimum
    c = check(store, registry, CONFIG)
    assert c.action == ROLLBACK and c.decision.ci_high < 0
    act(registry, c, "learner-1")
    assert registry.aliases() == {CHAMPION: "v0"}
    record = registry.get(v)
    assert record.status is VersionStatus.REJECTED and "canary lost" in record.error
    rolled = [e for e in registry.history() if isinstance(e, PolicyRolledBack)]
    assert (rolled[-1].from_version, rolled[-1].to_version) == (v, "v0")


def test_too_little_evidence_waits_and_runs_before_the_canary_do_not_count(
    registry, store, tmp_path
):
    log_arm(store, "v0", 0, 50, finished_at=time.time() - 3600)  # before the canary
    v = _canary(registry, tmp_path)
    log_arm(store, "v0", 5, 5)
    log_arm(store, v, 5, 5)
    base, cand = arm_rewards(store, "v0", v, registry.get(v).report["canary"]["started_at"], 1000)
    assert (len(base), len(cand)) == (10, 10)
    c = check(store, registry, CONFIG)
    assert c.action == CONTINUE
    assert act(registry, c, "x").startswith(f"canary {v} vs v0: 10 vs 10 runs")
    assert registry.aliases()[CANDIDATE] == v  # nothing moved
    late = check(store, registry, CONFIG, now=time.time() + CONFIG.timeout_s + 1)
    assert late.action == TIMEOUT
    act(registry, late, "learner-1")
    assert CANDIDATE not in registry.aliases() and registry.resolve(CHAMPION) == "v0"


def test_no_candidate_no_check(registry, store):
    assert check(store, registry, CONFIG) is None
