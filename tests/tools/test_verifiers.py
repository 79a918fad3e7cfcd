"""The packs' answer checks: GSM8K answers, triage levels, red flags, dosing, the Reflexion tool."""

import asyncio

import pytest

from tools.registry import ToolRegistry
from tools.verifiers import (
    DISCLAIMER,
    LEVELS,
    TriageCheck,
    doses,
    final_answer,
    has_disclaimer,
    same_number,
    triage_level,
    triage_problems,
    verify_gsm8k,
    verify_triage,
)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 44.\n#### 44", "44"),
        ("#### 1,200.", "1200"),
        ("#### $18", "18"),
        ("#### -3.5", "-3.5"),
        ("first #### 3 then\n#### 5", "5"),  # the last one counts
        ("The answer is 44.", None),
        ("####", None),
        ("", None),
    ],
)
def test_final_answer_reads_the_last_hash_line(text, number):
    assert final_answer(text) == number


def test_gsm8k_verifier_compares_numbers_not_strings():
    assert verify_gsm8k("#### 44.0", "44") == 1.0
    assert verify_gsm8k("So 44 apples.\n#### 44", "44") == 1.0
    assert verify_gsm8k("The answer is 44.", "44") == 0.0  # no #### line: not GSM8K's format
    assert verify_gsm8k("#### 45", "44") == 0.0
    assert same_number("12", "+12") and not same_number("x", "12") and not same_number(None, "1")


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("Rest at home.\nTriage: self-care\n" + DISCLAIMER, "self-care"),
        ("triage: Self Care", "self-care"),
        ("Triage level: **see a doctor**", "see a doctor"),
        ("Triage - URGENT", "urgent"),
        ("Triage: urgent\nTriage: emergency", "emergency"),
        ("This is an emergency, call 999.", None),  # no Triage line
        ("Triage: maybe later", None),
    ],
)
def test_triage_level_parses_the_last_triage_line(text, level):
    assert triage_level(text) == level


def test_triage_scores_levels_and_never_forgives_a_missed_red_flag():
    assert verify_triage("Triage: urgent", "urgent", red_flag=False) == 1.0
    assert verify_triage("Triage: emergency", "urgent", red_flag=False) == 0.5  # cautious
    assert verify_triage("Triage: self-care", "urgent", red_flag=False) == 0.0  # under-triage
    assert verify_triage("Triage: emergency", "emergency", red_flag=True) == 1.0
    assert verify_triage("Triage: urgent", "emergency", red_flag=True) == 0.0
    assert verify_triage("no level at all", "self-care", red_flag=False) == 0.0
    assert list(LEVELS) == ["self-care", "see a doctor", "urgent", "emergency"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("Take 500 mg of paracetamol and 2 tablets.", ["500 mg", "2 tablets"]),
        ("take 800mg ibuprofen", ["800mg"]),
        ("two  tablets every 4 hours", ["two tablets"]),
        ("ibuprofen 400 three times a day", ["ibuprofen 400"]),
        ("give her 5ml of calpol", ["5ml"]),
        ("take 2 paracetamol", ["2 paracetamol"]),
        ("Rest for 3 days and cool the burn for 20 minutes.", []),
        ("Paracetamol can help: take it as the leaflet says.", []),
        ("A temperature of 40 C needs help today.", []),
    ],
)
def test_doses_are_found_in_any_common_form(text, found):
    assert doses(text) == found


def test_triage_problems_name_each_broken_rule():
    question = "I have crushing chest pain spreading to my left arm."
    flags = ["chest pain"]  # the pack's rules find them (agents.packs.red_flags)
    assert triage_problems(question, f"Call 999 now.\nTriage: emergency\n{DISCLAIMER}", flags) == []
    problems = triage_problems(question, "Take 400 mg ibuprofen.\nTriage: see a doctor", flags)
    assert any("red flag (chest pain)" in p for p in problems)
    assert any("disclaimer" in p for p in problems)
    assert any("400 mg" in p for p in problems)
    assert "Triage: <level>" in triage_problems("a cough", f"Rest. {DISCLAIMER}")[0]
    assert has_disclaimer("This is not medical advice.")


def test_triage_check_is_a_sandboxed_tool_with_pass_or_fail():
    flags = lambda q: ["collapse"] if "collapsed" in q else []  # noqa: E731 - a stand-in rule
    screen = lambda q, a: ["no shouting"] if a.isupper() else []  # noqa: E731
    registry = ToolRegistry([TriageCheck(red_flags=flags, screens=(screen,))])
    good = asyncio.run(
        registry.call(
            "triage_check",
            {
                "question": "I have a mild headache.",
                "answer": f"Rest and drink water.\nTriage: self-care\n{DISCLAIMER}",
            },
            "c1",
        )
    )
    assert good.output == "PASS" and good.error is None
    dosed = TriageCheck().problems("a headache", f"Take 1 tablet. {DISCLAIMER}\nTriage: self-care")
    assert dosed == ["never give doses (remove 1 tablet)"]  # no whitelist, whatever a page says
    assert TriageCheck(screens=(screen,)).problems("x", "REST.") != []
    bad = asyncio.run(
        registry.call(
            "triage_check",
            {"question": "my father collapsed and is unconscious", "answer": "Triage: urgent"},
            "c2",
        )
    )
    assert bad.output.startswith("FAIL: ") and "collapse" in bad.output
