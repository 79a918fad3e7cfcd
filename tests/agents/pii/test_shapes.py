"""Identifier shapes in casual text: codes people quote as theirs, every way to write a date,
lower-case names; and the clinical numbers that are none of these.

Probe sets written for this check, each before the rules it measures. `shapes_held_out.jsonl`
(68 identifiers, 30 messages of clinical numbers) was committed before the scrubber changed;
`shapes_dev.jsonl` (65, 20) is what the rules were written against. Then each held-out set was
measured once, what it missed was fixed as a shape, and a new set was written before the next
measurement:

| set        | before the rules | measured once | after the fixes it prompted |
|------------|------------------|---------------|-----------------------------|
| dev        | 47/65            | (tuned on)    | 65/65                       |
| held-out   | 51/68            | 65/68         | 68/68                       |
| held-out-2 | 27/41            | 35/41         | 40/41                       |
| held-out-3 | 32/41            | 39/41         | 41/41                       |

Once-measured, the three held-out sets give 139/150 (0.927; 110/150 before). The floors below
keep today's figures. An identifier is caught when its raw value is gone and no distinctive part
of it (a digit group, a name) is left; a date's year may stay, as Safe Harbor allows. Run with
`-s` for the tables.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from agents.packs.maths_problems import gsm8k, template_eval, template_train
from agents.packs.triage_cases import cases
from agents.pii import PhiScrubber

HERE = Path(__file__).parent
FILES = {
    "dev": "shapes_dev.jsonl",
    "held-out": "shapes_held_out.jsonl",
    "held-out-2": "shapes_held_out_2.jsonl",
    "held-out-3": "shapes_held_out_3.jsonl",
}
CORPORA = {
    batch: [json.loads(line) for line in (HERE / name).open(encoding="utf-8")]
    for batch, name in FILES.items()
}
FLOOR = {"dev": 1.0, "held-out": 1.0, "held-out-2": 0.97, "held-out-3": 1.0}  # 40/41: "pav"


@pytest.fixture(scope="module")
def scrubber() -> PhiScrubber:
    return PhiScrubber()


def caught(value: str, kind: str, out: str) -> bool:
    """The raw value is gone, and so is each of its digit groups and name words."""
    if value in out:
        return False
    for part in re.findall(r"[\w'’-]+", value):
        if kind == "DATE" and re.fullmatch(r"'?\d{2}|(?:19|20)\d{2}", part):
            continue  # the year stays
        distinctive = sum(c.isdigit() for c in part) >= 3 or (kind == "NAME" and len(part) > 2)
        if distinctive and re.search(rf"(?<!\w){re.escape(part)}(?!\w)", out):
            return False
    return True


@pytest.mark.parametrize("batch", list(CORPORA))
def test_identifier_shapes_are_caught(scrubber, batch):
    hit, total, missed = Counter(), Counter(), []
    for row in CORPORA[batch]:
        out = scrubber.scrub(row["text"])
        for ident in row["identifiers"]:
            total[ident["type"]] += 1
            ok = caught(ident["value"], ident["type"], out)
            hit[ident["type"]] += ok
            if not ok:
                missed.append((ident["value"], out))
    recall = sum(hit.values()) / sum(total.values())
    print(f"\n{batch}: " + ", ".join(f"{t} {hit[t]}/{total[t]}" for t in sorted(total)))
    print(f"{batch}: {sum(hit.values())}/{sum(total.values())} = {recall:.3f}; missed {missed}")
    assert recall >= FLOOR[batch], missed


@pytest.mark.parametrize("batch", list(CORPORA))
def test_clinical_numbers_survive(scrubber, batch):
    negatives = [r for r in CORPORA[batch] if not r["identifiers"]]
    found = [(r["text"], [(f.type, f.text) for f in scrubber.find(r["text"])]) for r in negatives]
    lost = [
        (k, r["text"])
        for r in CORPORA[batch]
        for k in r.get("keep", ())
        if k not in scrubber.scrub(r["text"])
    ]
    assert [f for f in found if f[1]] == []
    assert lost == []


@pytest.mark.parametrize(
    "text, expected",
    [
        # a code a person quotes, by what it is on or called
        ("my wristband says AB12-3345X", "my wristband says [MRN]"),
        ("MRN: h0042173", "MRN: [MRN]"),
        ("case ref QX-88-1723, they said", "case ref [ID], they said"),
        ("patient no. 55 8812", "patient no. [MRN]"),
        ("subscriber: mcx 448 1029", "subscriber: [HEALTH_PLAN]"),
        ("my account number's 00418 7731", "my account number's [ACCOUNT]"),
        ("incident no. 2291-44 from the crew", "incident no. [ID] from the crew"),
        ("the label says SPN 44812 00", "the label says [ID]"),
        ("my locker key is 4B-119, ok", "my locker key is [ID], ok"),
        ("letter ref gp/22/0417 at the top", "letter ref [ID] at the top"),
        # or by its shape alone
        ("it's on my band, ZP40021", "it's on my band, [ID]"),
        ("quote AQ/7781/KL please", "quote [ID] please"),
        # every way to write a date: the day and month go, the year stays
        ("diagnosed 3/14/21", "diagnosed [DATE]/21"),
        ("dob 12/25/'99", "dob [DATE]/'99"),
        ("seen 1 12 2020 by the gp", "seen [DATE] 2020 by the gp"),
        ("dob 04 11 88", "dob [DATE] 88"),
        ("friday 13/10 i get results", "friday [DATE] i get results"),
        ("mri on the 22nd", "mri on the [DATE]"),
        ("need it by the 21st, please", "need it by the [DATE], please"),
        ("since march 2021", "since [DATE] 2021"),
        ("it started the 3rd of march '21", "it started the [DATE] '21"),
        ("last jab mar 3 21", "last jab [DATE] 21"),
        ("operation 03.03.21", "operation [DATE].21"),
        # lower-case names, by the contexts people use names in
        ("my husband, col, has a bad back", "my husband, [NAME], has a bad back"),
        ("my son (fintan) keeps vomiting", "my son ([NAME]) keeps vomiting"),
        ("i am asking for my mother in law, hilde", "i am asking for my mother in law, [NAME]"),
        ("my childminder nkechi noticed", "my childminder [NAME] noticed"),
        ("my twins, ella and eva, are sick", "my twins, [NAME] and [NAME], are sick"),
        ("she's called precious and she's 8", "she's called [NAME] and she's 8"),
        ("a midwife named oona checked me", "a midwife named [NAME] checked me"),
        ("nurse said ask for dr mbeki", "nurse said ask for dr [NAME]"),
        ("name is jan kowalczyk", "name is [NAME] [NAME]"),
        ("dawit and me both have flu", "[NAME] and me both have flu"),
        ("this is ngozi's mum", "this is [NAME]'s mum"),
        ("x, ruthie", "x, [NAME]"),
        ("thank you so much, wren", "thank you so much, [NAME]"),
        # what the held-out sets taught, as shapes
        ("crn 2291 8812 is my number at the surgery", "[ID] is my number at the surgery"),
        ("my chart at st marys is c-00912-7", "my chart at st marys is [ID]"),
        ("the paramedics wrote 7781-XK on my hand", "the paramedics wrote [ID] on my hand"),
        ("my number at the clinic is FC 20 118", "my number at the clinic is [ID]"),
        ("i'm nikos btw, 45", "i'm [NAME] btw, 45"),
        ("our little one, ines, wont settle", "our little one, [NAME], wont settle"),
        ("my son's friend, bilal, was sick", "my son's friend, [NAME], was sick"),
        ("my daughters ruby-mae and isla", "my daughters [NAME] and [NAME]"),
        ("my neighbour mrs oyelaran fell", "my neighbour mrs [NAME] fell"),
        ("due again around the 30th", "due again around the [DATE]"),
    ],
)
def test_identifier_shapes(scrubber, text, expected):
    assert scrubber.scrub(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "bp 142/91, was 120/80 last week",
        "temp 38.4 and 2.5 mg of the syrup at 3:30",
        "glucose 28 mmol/L, pain 7/10",
        "on 3/4 of a tablet now",
        "reduced by 1/2 a tab last week",
        "i take 2x500mg paracetamol every 4-6 hours",
        "tumour staged t2n0m0, ca19-9 was 40",
        "my temp is 38.4 and my sugar was 5.6-7.8",
        "my cholesterol: LDL 160, HDL 40",
        "percocet 5/325, hr 120-140 when i stand",
        "in the 2nd trimester, on the 2nd floor, the 3rd dose",
        "my dr appt is tomorrow at 3:30",
        "my gp said to come here",
        "my partner, male, 40, chest pain",
        "my son, aged 4, has a rash; my husband, who is diabetic, too",
        "paracetamol and me don't get on",
        "a thing called sciatica, hi doc, thanks, doc",
        "he worked every day from the 3rd to the 8th",
        "on 2.5/10 mg of the combo pill, she's on 1/2 strength formula",
        "i'm dizzy. i'm asthmatic, btw",
        "a 10-year-old with a 3-day-old rash",
    ],
)
def test_clinical_numbers_and_words_are_no_identifiers(scrubber, text):
    assert scrubber.find(text) == []


def test_the_packs_numbers_stay(scrubber):
    """The tutoring pack scrubs its problems and the medical pack its messages: no number in
    them becomes a code or a date (a month's name in a problem may; a year never)."""
    probes = Path(__file__).parents[3] / "agents" / "packs" / "data" / "triage_probe.jsonl"
    texts = (
        [p.question for p in template_eval(480)]
        + [p.question for p in template_train(480, 0, set())]
        + [p.question for p in gsm8k("train")]
        + [p.question for p in gsm8k("eval")]
        + [c.message for c in cases("train")]
        + [c.message for c in cases("eval")]
        + [json.loads(line)["message"] for line in probes.open(encoding="utf-8")]
    )
    numeric = [
        (f.type, f.text)
        for t in dict.fromkeys(texts)
        for f in scrubber.find(t)
        if f.type not in ("NAME", "LOCATION", "AGE") and not re.search(r"[A-Za-z]{3}", f.text)
    ]
    assert numeric == []
