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


def test_a_candidate_as_good_as_the_champion_with_healthy_figures_passes():
    champion = _suite("v0", [1] * 15 + [0] * 5)
    candidate = _suite("v1", [1] * 16 + [0] * 4)
    report = decide("quiz", candidate, champion, HEALTHY, GateConfig())
    assert report.verdict == PASS and report.passed and report.failed == []
    assert report.comparison["alpha"] == 0.05 and report.comparison["passed"]
    assert report.comparison["diff"] == pytest.approx(0.05)
    assert "not worse on held-out tasks" in report.reason


def test_worse_beyond_noise_fails_the_mcnemar_test():
    champion = _suite("v0", [1] * 20)
    candidate = _suite("v1", [1] * 12 + [0] * 8)  # 8 discordant pairs, all champion's: p = 1/256
    report = decide("quiz", candidate, champion, HEALTHY, GateConfig())
    assert report.verdict == REJECT and EVAL_TEST in report.failed
    assert report.comparison["p_worse"] == pytest.approx(1 / 256)
    assert "McNemar" in report.reason


def test_a_small_dip_within_noise_passes_the_test_but_a_named_guard_still_rejects():
    champion = _suite("v0", [1] * 20)
    candidate = _suite("v1", [1] * 19 + [0], length=30)  # answers padded 8 -> 30 tokens
    report = decide("quiz", candidate, champion, HEALTHY, GateConfig())
    assert report.comparison["passed"]
    assert report.verdict == REJECT and report.failed == ["length_drift"]
    assert "length_drift 3.75 outside" in report.reason


def test_eval_outcomes_feed_the_tool_use_and_goodhart_guards():
    champion = _suite("v0", [1] * 10, needs_tool="calculator")
    candidate = _suite("v1", [1] * 8 + [0] * 2, tool=[False] * 10, needs_tool="calculator")
    evidence = GuardEvidence(**{**HEALTHY.__dict__, "train_gain": 0.4})
    report = decide("quiz", candidate, champion, evidence, GateConfig())
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
    report = decide("quiz", _suite("v1", [1] * 10), suite, HEALTHY, GateConfig(), ope=ope)
    assert report.failed == [OPE_CHECK]
    refused = snis(r, behaviour, worse * 100, min_ess=90)  # too far from the logs: no conclusion
    ok = decide("quiz", _suite("v1", [1] * 10), suite, HEALTHY, GateConfig(), ope=refused)
    assert ok.passed and "not concluded" in ok.summary()


def test_different_task_sets_cannot_be_compared():
    report = decide("quiz", _suite("v1", [1] * 3), _suite("v0", [1] * 4), HEALTHY, GateConfig())
    assert report.verdict == ERROR and report.failed == [EVAL_TEST]


def test_the_report_is_json_with_a_readable_table_of_guards():
    champion = _suite("v0", [1] * 10)
    report = decide(
        "quiz",
        _suite("v1", [1] * 10, length=40),
        champion,
        HEALTHY,
        GateConfig(),
        training={"trained_runs": 12},
    )
    d = json.loads(json.dumps(report.to_dict()))
    assert d["verdict"] == REJECT and d["failed"] == ["length_drift"]
    assert d["training"] == {"trained_runs": 12}
    assert {g["name"]: g["verdict"] for g in d["guards"]}["length_drift"] == "FAIL"
    summary = d["summary"].splitlines()
    assert summary[0] == "gate v1 vs champion v0: REJECT (length_drift)"
    assert any(line.startswith("held-out quiz (10 tasks)") for line in summary)
    row = next(line for line in summary if line.startswith("length_drift"))
    assert "5" in row and "0.5 .. 1.5x" in row and "FAIL" in row


def test_refusal_never_passes():
    report = refuse("v1", "v0", "eval_suite", "pack 'quiz' has an empty eval suite")
    assert report.verdict == ERROR and not report.passed and report.failed == ["eval_suite"]
    assert "empty eval suite" in report.summary()


def test_the_report_gives_each_versions_own_red_flag_escalations():
    """The envelope escalates for every version: the report counts what the model did itself."""

    def run(version, escalated):
        base = _suite(version, [int(e) for e in escalated] + [1, 1])
        flagged = [replace(o, escalated=e) for o, e in zip(base.outcomes, escalated, strict=False)]
        return SuiteRun(version, tuple(flagged) + base.outcomes[len(escalated) :])

    report = decide(
        "triage", run("v2", [True, True, False]), run("v1", [False] * 3), HEALTHY, GateConfig()
    )
    assert report.red_flags == {"v2": [2, 3], "v1": [0, 3]}
    assert "red flags escalated by the model itself (before any envelope): v2 2/3, v1 0/3" in (
        report.summary()
    )
    assert json.loads(json.dumps(report.to_dict()))["red_flags"]["v2"] == [2, 3]
    plain = decide("quiz", _suite("v2", [1, 1]), _suite("v1", [1, 1]), HEALTHY, GateConfig())
    assert plain.red_flags == {} and "red flags" not in plain.summary()
