"""The gate's decision on hand-made suite outcomes and figures; the report's JSON and summary."""

import json
from dataclasses import replace

import pytest
import torch

from learner.gate.eval_gate import (
    ERROR,
    EVAL_TEST,
    OPE_CHECK,
    PASS,
    REJECT,
    GateConfig,
    SuiteRun,
    TaskOutcome,
    decide,
    refuse,
)
from learner.gate.guards import GuardEvidence
from learner.gate.ope import snis
from learner.gate.sequential import IMPROVED, sequential_test
from learner.gate.stats import paired_comparison, paired_intervals, wilson

HEALTHY = GuardEvidence(
    kl=0.05, candidate_entropy=0.8, reference_entropy=1.0, divergence_tokens=300, clip_ratio=0.01
)


def _suite(version, solved, *, tool=None, length=8, needs_tool=None):
    tool = tool if tool is not None else [True] * len(solved)
    return SuiteRun(
        version,
        tuple(
            TaskOutcome(
                f"t{i}", float(s), bool(s), needs_tool=needs_tool, used_tool=u, answer_tokens=length
            )
            for i, (s, u) in enumerate(zip(solved, tool, strict=True))
        ),
    )


CONFIG = GateConfig(margin=0.1, looks=(20,))


def decide_on(candidate, champion, evidence=HEALTHY, config=CONFIG, **kw):
    """The gate on greedy suites: one run a task, the test and the guards on the same runs."""
    test = sequential_test(
        [[int(o.solved)] for o in champion.outcomes],
        [[int(o.solved)] for o in candidate.outcomes],
        config.looks,
        margin=config.margin,
        alpha_not_worse=config.alpha,
        alpha_improved=config.alpha_improved,
    )
    return decide("quiz", test, candidate, champion, evidence, config, **kw)


def test_a_candidate_as_good_as_the_champion_with_healthy_figures_passes():
    champion = _suite("v0", [1] * 15 + [0] * 5)
    candidate = _suite("v1", [1] * 16 + [0] * 4)
    report = decide_on(candidate, champion)
    assert report.verdict == PASS and report.passed and report.failed == []
    assert report.sequential["alpha"] == 0.05 and report.sequential["passed"]
    assert report.sequential["diff"] == pytest.approx(0.05)
    assert "not worse by more than 0.1 on 20 held-out tasks" in report.reason


def test_a_clear_gain_is_reported_as_improved_with_its_interval():
    report = decide_on(_suite("v1", [1] * 20), _suite("v0", [1] * 8 + [0] * 12))
    assert report.passed and report.sequential["improved"] == IMPROVED
    assert report.sequential["ci_low"] > 0 and "improved: +0.600" in report.reason


def test_worse_beyond_the_margin_fails_the_test():
    champion = _suite("v0", [1] * 20)
    candidate = _suite("v1", [1] * 12 + [0] * 8)
    report = decide_on(candidate, champion)
    assert report.verdict == REJECT and EVAL_TEST in report.failed
    assert report.sequential["not_worse"] == "worse"
    assert "not shown to be within 0.1 of the champion" in report.reason


def test_a_small_dip_within_the_margin_passes_the_test_but_a_named_guard_still_rejects():
    champion = _suite("v0", [1] * 20)
    candidate = _suite("v1", [1] * 20, length=30)  # answers padded 8 -> 30 tokens
    report = decide_on(candidate, champion)
    assert report.sequential["passed"]
    assert report.verdict == REJECT and report.failed == ["length_drift"]
    assert "length_drift 3.75 outside" in report.reason


def test_eval_outcomes_feed_the_tool_use_and_goodhart_guards():
    champion = _suite("v0", [1] * 10, needs_tool="calculator")
    candidate = _suite("v1", [1] * 8 + [0] * 2, tool=[False] * 10, needs_tool="calculator")
    evidence = GuardEvidence(**{**HEALTHY.__dict__, "train_gain": 0.4})
    wide = GateConfig(margin=0.5, looks=(10,))  # a margin wide enough that the guards decide
    report = decide_on(candidate, champion, evidence, wide)
    assert set(report.failed) == {"tool_use", "goodhart"}
    by_name = {g.name: g for g in report.guards}
    assert by_name["tool_use"].figure == pytest.approx(-1.0)
    assert by_name["goodhart"].figure == pytest.approx(-0.2)


def test_an_off_policy_estimate_confidently_below_the_logged_mean_rejects():
    r = torch.tensor([1.0, 1.0, -1.0, -1.0] * 25)
    behaviour = torch.zeros(100)
    worse = torch.tensor([-0.3, -0.3, 0.3, 0.3] * 25)  # the candidate prefers the bad answers
    ope = snis(r, behaviour, worse, min_ess=10)
    assert ope.ci_high < ope.behaviour_mean
    suite = _suite("v0", [1] * 10)
    ten = GateConfig(margin=0.2, looks=(10,))  # ten tied tasks show "not worse" to 0.2
    report = decide_on(_suite("v1", [1] * 10), suite, config=ten, ope=ope)
    assert report.failed == [OPE_CHECK]
    refused = snis(r, behaviour, worse * 100, min_ess=90)  # too far from the logs: no conclusion
    ok = decide_on(_suite("v1", [1] * 10), suite, config=ten, ope=refused)
    assert ok.passed and "not concluded" in ok.summary()


def test_different_task_sets_cannot_be_compared():
    test = sequential_test([[1]] * 3, [[1]] * 3, (3,))
    report = decide("quiz", test, _suite("v1", [1] * 3), _suite("v0", [1] * 4), HEALTHY, CONFIG)
    assert report.verdict == ERROR and report.failed == [EVAL_TEST]


def test_the_report_is_json_with_a_readable_table_of_guards():
    champion = _suite("v0", [1] * 10)
    report = decide_on(
        _suite("v1", [1] * 10, length=40),
        champion,
        config=GateConfig(margin=0.2, looks=(10,)),
        training={"trained_runs": 12},
    )
    d = json.loads(json.dumps(report.to_dict()))
    assert d["verdict"] == REJECT and d["failed"] == ["length_drift"]
    assert d["training"] == {"trained_runs": 12}
    assert {g["name"]: g["verdict"] for g in d["guards"]}["length_drift"] == "FAIL"
    summary = d["summary"].splitlines()
    assert summary[0] == "gate v1 vs champion v0: REJECT (length_drift)"
    assert any(line.startswith("held-out quiz: 8 sampled runs a task") for line in summary)
    assert any(line.split()[:2] == ["1", "10"] for line in summary)  # the look's row
    row = next(line for line in summary if line.startswith("length_drift"))
    assert "5" in row and "0.5 .. 1.5x" in row and "FAIL" in row


def test_refusal_never_passes():
    report = refuse("v1", "v0", "eval_suite", "pack 'quiz' has an empty eval suite")
    assert report.verdict == ERROR and not report.passed and report.failed == ["eval_suite"]
    assert "empty eval suite" in report.summary()


def test_each_sides_whole_run_success_comes_with_its_wilson_interval():
    cmp = paired_comparison([1] * 15 + [0] * 5, [1] * 16 + [0] * 4)
    c = paired_intervals(cmp)  # what the gate stores beside the whole runs' comparison
    assert (c["champion_solved"], c["candidate_solved"]) == (15, 16)
    assert c["candidate_ci"] == list(wilson(16, 20)) and c["champion_ci"] == list(wilson(15, 20))
    assert c["candidate_ci"][0] < 0.8 < c["candidate_ci"][1]


def test_the_report_gives_each_versions_own_red_flag_escalations():
    """The envelope escalates for every version: the report counts what the model did itself."""

    def run(version, escalated):
        base = _suite(version, [int(e) for e in escalated] + [1, 1])
        flagged = [replace(o, escalated=e) for o, e in zip(base.outcomes, escalated, strict=False)]
        return SuiteRun(version, tuple(flagged) + base.outcomes[len(escalated) :])

    five = GateConfig(margin=0.5, looks=(5,))  # a margin wide enough that only the counts matter
    report = decide_on(run("v2", [True, True, False]), run("v1", [False] * 3), config=five)
    assert report.red_flags == {"v2": [2, 3], "v1": [0, 3]}
    assert "red flags escalated by the model itself (before any envelope): v2 2/3, v1 0/3" in (
        report.summary()
    )
    assert json.loads(json.dumps(report.to_dict()))["red_flags"]["v2"] == [2, 3]
    two = GateConfig(margin=0.9, looks=(2,))
    plain = decide_on(_suite("v2", [1, 1]), _suite("v1", [1, 1]), config=two)
    assert plain.red_flags == {} and "red flags" not in plain.summary()
