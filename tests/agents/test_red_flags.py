"""The medical pack's red-flag rules, and the probe messages kept apart from training."""

import json
import subprocess
from pathlib import Path

import pytest

from agents.packs import get_pack
from agents.packs.common import scrub_input
from agents.packs.red_flags import ADVICE, RULES, assess, correct, red_flags
from agents.packs.triage_cases import SYMPTOMS, cases
from agents.packs.triage_rules import parse, rules
from tools.verifiers import LEVELS

ROOT = Path(__file__).resolve().parents[2]
PROBE_FILE = ROOT / "agents" / "packs" / "data" / "triage_probe.jsonl"


HELDOUT_FILE = ROOT / "agents" / "packs" / "data" / "triage_heldout.jsonl"


def probes() -> list[dict]:
    return [json.loads(line) for line in PROBE_FILE.read_text().splitlines() if line.strip()]


def heldout() -> list[dict]:
    """Messages written from public guidance by someone who had not read the rules."""
    return [
        json.loads(line)
        for path in sorted(HELDOUT_FILE.parent.glob("triage_heldout*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_the_probe_messages_cover_what_the_check_asks_for():
    rows = probes()
    kinds = {k for r in rows for k in r["kinds"]}
    assert len(rows) >= 40 and len({r["message"] for r in rows}) == len(rows)
    assert {"lowercase", "misspelt", "negated", "two_symptoms", "someone_else"} <= kinds
    assert sum(r["red_flag"] for r in rows) >= 20
    assert sum("negated" in r["kinds"] for r in rows) >= 10


def test_the_probe_set_covers_each_category_and_names_the_list_it_was_written_from():
    rows = probes()
    kinds = {k for r in rows for k in r["kinds"]}
    categories = {
        "infant_fever",
        "child_signs",
        "suicide_passive",
        "pregnancy",
        "metabolic",
        "mmol",
        "mgdl",
        "fahrenheit",
        "sepsis",
        "immunosuppressed",
        "anticoagulant",
        "head_injury",
        "poisoning",
        "floor",
        "ask",
    }
    assert categories <= kinds, categories - kinds
    for r in rows:
        if "list" in r:
            assert r["list"] in rules().sources, r


def test_each_probe_that_asks_reaches_its_level_on_the_patients_reply():
    for r in probes():
        found = assess(r["message"])
        if "reply" not in r:
            assert "ask" not in r["kinds"], r
            continue
        assert found.ask is not None and found.ask.required, r["message"]
        after = assess(f"{r['message']}\n{found.ask.label}: {r['reply']}")
        assert after.ask is None and after.answered == (found.ask.fact,)
        assert bool(after.flags) == (r["level"] == "emergency"), (r["message"], after)
        if after.floor is not None:
            assert LEVELS.index(after.floor) <= LEVELS.index(r["level"]), r["message"]


def test_the_floor_of_each_floor_probe_is_its_level():
    for r in probes():
        if "floor" in r["kinds"]:
            assert assess(r["message"]).floor == r["level"], r["message"]


def test_rules_escalate_every_red_flag_of_the_probe_and_no_negated_one():
    rows = probes()
    missed = [r["message"] for r in rows if r["red_flag"] and not red_flags(r["message"])]
    raised = [(r["message"], red_flags(r["message"])) for r in rows if not r["red_flag"]]
    assert missed == []
    assert [m for m, flags in raised if flags] == []


def test_rules_agree_with_every_case_level_of_the_pack():
    for split in ("train", "eval"):
        for c in cases(split):
            assert bool(red_flags(c.message)) == (c.level == "emergency"), c.message
            floor = assess(c.message).floor  # no floor above a case's own level
            if c.level != "ask" and floor is not None:
                assert LEVELS.index(floor) <= LEVELS.index(c.level), (c.message, floor)


@pytest.mark.parametrize(
    "message, flag",
    [
        ("Crushing chest pain spreading to my left arm", "chest pain"),
        ("PAIN IN MY CHEST, it is crushing", "chest pain"),  # case and word order
        ("my chest hurts and i feel sick", "chest pain"),
        ("cant breathe", "difficulty breathing"),
        ("I can't breathe properly", "difficulty breathing"),
        ("my speech is slured", "stroke signs"),  # misspelt
        ("her face is droopy on one side", "stroke signs"),
        ("he is unconcious", "collapse"),
        ("a siezure that will not end", "collapse"),
        ("my throat is closing up after peanuts", "severe allergic reaction"),
        ("i have been thinking about suicide", "thoughts of suicide"),
        ("the bleeding won't stop", "heavy bleeding"),
        ("my neighbour is not breathing", "difficulty breathing"),  # someone else
        ("I'm not sure if it's a stroke", "stroke signs"),  # uncertainty is no negation
        ("no fever, but crushing chest pain", "chest pain"),  # "but" ends the negation
        ("no cough and my chest is tight", "chest pain"),  # so does "and"
        ("rash that does not fade under a glass, and a fever", "meningitis signs"),
    ],
)
def test_red_flags_are_found_however_they_are_written(message, flag):
    assert flag in red_flags(message)


@pytest.mark.parametrize(
    "message",
    [
        "no chest pain",
        "Denies shortness of breath.",
        "denies chest pain, palpitations, or shortness of breath",
        "I don't have any chest pain or trouble breathing",
        "without slurred speech or face drooping",
        "never had a seizure",
        "my dad has no chest pain today",
        "a cough with a high temperature and my breathing is getting worse",
        "a deep cut on my hand that is gaping open",
        "pain in my arm for a week",  # "week" is no misspelt "weak"
        "a small cut on my finger that stopped bleeding",
    ],
)
def test_negated_or_absent_red_flags_are_not_raised(message):
    assert red_flags(message) == []


def test_spelling_repair_needs_one_unique_rule_word_and_spares_real_words():
    assert correct("chset") == "chest" and correct("unconcious") == "unconscious"
    assert correct("never") == "never" and correct("gaping") == "gaping"
    assert correct("weeks") == "weeks" and correct("xyzzyq") == "xyzzyq"


def test_every_rule_names_a_published_source_and_every_red_flag_has_advice():
    data = rules()
    for rule in RULES:
        assert rule.source in data.sources, rule
        if rule.level == "emergency":
            assert rule.flag in ADVICE, rule.flag
    # the lists the issue names are all cited
    cited = {r.source for r in RULES} | {a.source for a in data.asks}
    for list_ in ("nice_ng143", "nice_ng51", "who_etat", "mts", "nhs_999", "nhs_preeclampsia"):
        assert list_ in cited, list_


@pytest.mark.parametrize(
    "broken, says",
    [
        (
            {"rule": [{"flag": "x", "level": "emergency", "source": "nowhere", "all": ["a"]}]},
            "source",
        ),
        ({"rule": [{"flag": "x", "level": "soon", "source": "s", "all": ["a"]}]}, "level"),
        ({"rule": [{"flag": "x", "level": "urgent", "source": "s", "all": ["NOPE"]}]}, "NOPE"),
        ({"rule": [{"flag": "x", "level": "urgent", "source": "s"}]}, "at least one part"),
        ({"rule": [{"flag": "x", "level": "emergency", "source": "s", "all": ["a"]}]}, "advice"),
        ({"rule": [{"flag": "x", "level": "urgent", "source": "s", "who": {"tall": 1}}]}, "who"),
        (
            {"rule": [{"flag": "x", "level": "urgent", "source": "s", "reading": {"kind": "iq"}}]},
            "reading",
        ),
    ],
)
def test_a_rules_file_that_does_not_hold_together_is_refused_by_name(broken, says):
    with pytest.raises(ValueError, match=says):
        parse({"sources": {"s": "a list"}} | broken)


def test_scrubbing_the_message_keeps_its_red_flags():
    """The rules run on the scrubbed message: the scrubber must not hide a symptom."""
    for r in probes():
        assert red_flags(scrub_input(r["message"])) == red_flags(r["message"]), r["message"]


def test_probe_messages_never_enter_a_split_the_learner_uses():
    pack = get_pack("medical")
    used = {t.input.casefold() for split in ("train", "eval") for t in pack.tasks(split)}
    phrases = {p.casefold() for level in SYMPTOMS.values() for p in level}
    for r in probes() + heldout():
        text = r["message"].casefold()
        assert text not in used and not any(text in u for u in used), r["message"]
        assert text not in phrases
    # only the benchmark and the tests read the probe file: no training or eval code does
    found = subprocess.run(
        [
            "git",
            "grep",
            "--untracked",
            "-l",
            "-e",
            "triage_probe",
            "-e",
            "triage_heldout",
            "--",
            "agents",
            "learner",
            "deploy",
            "tools",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.stdout.split() == [], found.stdout
