"""Each guard on hand-made figures: where it passes, where it fires, when it cannot apply."""

import math

import pytest

from learner.gate.guards import (
    GuardConfig,
    GuardEvidence,
    clip_ratio,
    entropy_floor,
    goodhart,
    kl_to_reference,
    length_drift,
    reward_disagreement,
    reward_length_corr,
    run_guards,
    source_pair_disagreement,
    tool_use,
)

C = GuardConfig()


def test_kl_budget_and_no_evidence_fails_closed():
    assert kl_to_reference(0.2, 100, C).passed
    fired = kl_to_reference(0.9, 100, C)
    assert not fired.passed and fired.figure == 0.9 and fired.verdict == "FAIL"
    blind = kl_to_reference(None, 0, C)
    assert not blind.passed and blind.applicable and "no evidence" in blind.detail


def test_length_drift_is_a_ratio_of_means_bounded_both_ways():
    ok = length_drift([10, 12], [10, 12], C)
    assert ok.passed and ok.figure == pytest.approx(1.0)
    padded = length_drift([30, 36], [10, 12], C)  # 33 / 11 = 3x
    assert not padded.passed and padded.figure == pytest.approx(3.0)
    terse = length_drift([2, 2], [10, 10], C)
    assert not terse.passed and terse.figure == pytest.approx(0.2)
    assert not length_drift([], [10], C).passed


def test_reward_length_correlation_fires_when_length_is_rewarded():
    lengths = [5, 6, 7, 20, 22, 25, 5, 21]
    rewards = [-1, -1, -1, 1, 1, 1, -1, 1]  # long = good
    fired = reward_length_corr(rewards, lengths, C)
    assert not fired.passed and fired.figure > 0.9
    honest = reward_length_corr([1, -1, 1, -1, 1, -1, 1, -1], lengths, C)
    assert honest.passed
    few = reward_length_corr(rewards[:3], lengths[:3], C)
    assert few.verdict == "n/a" and few.passed
    flat = reward_length_corr([1.0] * 8, lengths, C)
    assert flat.verdict == "n/a"


def test_entropy_must_stay_within_a_band_around_the_reference_and_above_an_optional_floor():
    ok = entropy_floor(0.6, 1.0, C)
    assert ok.passed and ok.figure == pytest.approx(0.6)
    collapsed = entropy_floor(0.05, 1.0, C)
    assert not collapsed.passed and collapsed.figure == pytest.approx(0.05)
    assert "collapsed" in collapsed.detail
    scrambled = entropy_floor(2.5, 1.0, C)  # an oversized update: entropy blew up
    assert not scrambled.passed and "scrambled" in scrambled.detail
    floor = GuardConfig(entropy_floor=0.1)
    assert not entropy_floor(0.08, 0.1, floor).passed  # ratio fine, below the absolute floor
    assert not entropy_floor(None, None, C).passed


def test_goodhart_needs_the_training_reward_up_and_held_out_down():
    assert not goodhart(0.3, -0.2, C).passed  # the definition
    assert goodhart(0.3, -0.02, C).passed  # within the allowed drop
    assert goodhart(-0.1, -0.2, C).passed  # training reward did not go up: not Goodhart
    assert goodhart(0.3, 0.1, C).passed
    assert goodhart(None, -0.2, C).verdict == "n/a"
    assert not goodhart(0.3, None, C).passed


def test_tool_use_compares_rates_on_tasks_that_need_the_tool():
    fell = tool_use([False, False, True, False], [True, True, True, True], C)
    assert not fell.passed and fell.figure == pytest.approx(-0.75)
    assert tool_use([True, True], [True, False], C).passed
    assert tool_use([], [], C).verdict == "n/a"


def test_clip_ratio_threshold_and_dpo_only_rounds():
    assert clip_ratio(0.05, C).passed
    assert not clip_ratio(0.4, C).passed
    assert clip_ratio(None, C).verdict == "n/a"
    assert clip_ratio(math.nan, C).verdict == "n/a"


def test_disagreement_is_the_worst_pair_of_sources_on_shared_runs():
    scores = {f"t{i}": {"user": 1.0, "verifier": 1.0} for i in range(5)}
    scores |= {f"j{i}": {"judge": 1.0, "verifier": -1.0} for i in range(3)}
    scores |= {f"k{i}": {"judge": 0.0, "verifier": 1.0} for i in range(3)}
    pairs = source_pair_disagreement(scores)
    assert pairs[("user", "verifier")] == (0.0, 5)
    assert pairs[("judge", "verifier")] == (pytest.approx((3 * 1.0 + 3 * 0.5) / 6), 6)
    fired = reward_disagreement(scores, C)
    assert not fired.passed and "judge vs verifier on 6 runs" in fired.detail
    one_source = {f"t{i}": {"user": 1.0} for i in range(20)}
    assert reward_disagreement(one_source, C).verdict == "n/a"
    rare = {f"t{i}": {"user": 1.0, "verifier": -1.0} for i in range(4)}  # < min_coscored
    assert reward_disagreement(rare, C).verdict == "n/a"


def test_run_guards_names_every_guard_once_and_empty_evidence_fails_closed():
    results = run_guards(GuardEvidence(), C)
    assert [r.name for r in results] == [
        "kl_to_reference",
        "length_drift",
        "reward_length_corr",
        "entropy_floor",
        "goodhart",
        "tool_use",
        "clip_ratio",
        "reward_disagreement",
    ]
    failed = {r.name for r in results if not r.passed}
    assert failed == {"kl_to_reference", "length_drift", "entropy_floor", "goodhart"}
    assert all(r.to_dict()["verdict"] in ("pass", "FAIL", "n/a") for r in results)
