"""The PHI scrubber against a corpus of patient messages covering the 18 HIPAA identifier types.

Run with `-s` to see the per-type table. The corpus (`phi_corpus.jsonl`) holds messages with the
identifier strings they contain, and negatives full of medical facts that must survive.
Batch 1 was written before the scrubber; batch 2 after it, scoring 0.9125 recall before the
fixes it prompted (see the lead's report).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents.pii import TYPES, Finding, PhiScrubber

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "phi_corpus.jsonl").open()]
POSITIVES = [r for r in CORPUS if r["identifiers"]]
NEGATIVES = [r for r in CORPUS if not r["identifiers"]]
HIPAA = {
    "01 names": {"NAME"},
    "02 geography below state": {"ADDRESS", "LOCATION", "ZIP"},
    "03 dates, ages over 89": {"DATE", "AGE"},
    "04 telephone": {"PHONE"},
    "05 fax": {"FAX"},
    "06 e-mail": {"EMAIL"},
    "07 SSN": {"SSN"},
    "08 medical record no.": {"MRN"},
    "09 health plan no.": {"HEALTH_PLAN"},
    "10 account no.": {"ACCOUNT"},
    "11 certificate/licence": {"LICENSE"},
    "12 vehicle id/plate": {"VEHICLE"},
    "13 device id/serial": {"DEVICE"},
    "14 URL": {"URL"},
    "15 IP address": {"IP"},
    "16 biometric id": {"BIOMETRIC"},
    "17 face photo": {"PHOTO"},
    "18 other unique id": {"ID"},
}
_GENERIC = {
    "Street",
    "St",
    "Road",
    "Rd",
    "Avenue",
    "Ave",
    "Lane",
    "Drive",
    "County",
    "Apt",
    "Apartment",
    "Suite",
    "Unit",
    "Flat",
    "Box",
    "Close",
    "Terrace",
    "Rural",
    "Route",
    "Lot",
    "Park",
    "West",
    "High",
    "Lower",
    "corner",
    "and",
}


@pytest.fixture(scope="module")
def scrubber() -> PhiScrubber:
    return PhiScrubber()


@pytest.fixture(scope="module")
def scrubbed(scrubber) -> list[str]:
    return [scrubber.scrub(r["text"]) for r in CORPUS]


def test_corpus_covers_all_18_types_with_300_instances():
    counts = Counter(i["type"] for r in POSITIVES for i in r["identifiers"])
    assert sum(counts.values()) >= 300
    assert set(counts) <= set(TYPES)
    for category, types in HIPAA.items():
        assert sum(counts[t] for t in types) >= 10, category
    for r in POSITIVES:
        assert all(i["value"] in r["text"] for i in r["identifiers"]), r["text"]
    assert len(NEGATIVES) >= 50


def _caught(value: str, kind: str, output: str) -> bool:
    """The issue's measure: the raw value no longer appears in the output."""
    return value not in output


def _caught_strictly(value: str, kind: str, output: str) -> bool:
    """Also no distinctive part left: name/place words, or digit groups other than a year."""
    if value in output:
        return False
    words = output.split()
    for part in re.findall(r"[\w'’-]+", value):
        year = kind in ("DATE", "AGE") and re.fullmatch(r"(19|20)\d\d", part)
        distinctive = (part[0].isupper() and part not in _GENERIC and len(part) > 2) or (
            sum(c.isdigit() for c in part) >= 3 and not year
        )
        if distinctive and any(re.sub(r"\W", "", w) == re.sub(r"\W", "", part) for w in words):
            return False
    return True


def _recall(scrubbed, measure, batch=None):
    hit, total = Counter(), Counter()
    for row, out in zip(CORPUS, scrubbed, strict=True):
        if batch and row.get("batch") != batch:
            continue
        for ident in row["identifiers"]:
            total[ident["type"]] += 1
            hit[ident["type"]] += measure(ident["value"], ident["type"], out)
    return hit, total


def test_recall_per_type(scrubbed):
    hit, total = _recall(scrubbed, _caught)
    strict_hit, _ = _recall(scrubbed, _caught_strictly)
    print("\nHIPAA category               caught/total  recall  strict")
    for category, types in HIPAA.items():
        h, t, s = (sum(c[k] for k in types) for c in (hit, total, strict_hit))
        print(f"{category:28s} {h:4d}/{t:<4d}      {h / t:.3f}   {s / t:.3f}")
    overall = sum(hit.values()) / sum(total.values())
    strict = sum(strict_hit.values()) / sum(total.values())
    for batch in (1, 2):
        bh, bt = _recall(scrubbed, _caught, batch)
        print(f"batch {batch}: {sum(bh.values())}/{sum(bt.values())}")
    print(f"overall recall {overall:.4f}, strict (no part left) {strict:.4f}")
    missed = [
        (i["type"], i["value"])
        for r, out in zip(CORPUS, scrubbed, strict=True)
        for i in r["identifiers"]
        if not _caught(i["value"], i["type"], out)
    ]
    print("missed:", missed)
    assert overall >= 0.99, missed
    assert strict >= 0.97


def test_medical_facts_survive_and_false_positives_are_rare(scrubber, scrubbed):
    lost = [
        (fact, out)
        for r, out in zip(CORPUS, scrubbed, strict=True)
        if not r["identifiers"]
        for fact in r["keep"]
        if fact not in out
    ]
    flagged = [(r["text"], [(f.type, f.text) for f in scrubber.find(r["text"])]) for r in NEGATIVES]
    flagged = [f for f in flagged if f[1]]
    facts = sum(len(r["keep"]) for r in NEGATIVES)
    print(
        f"\nfacts kept {facts - len(lost)}/{facts}; negatives with any finding "
        f"{len(flagged)}/{len(NEGATIVES)} ({len(flagged) / len(NEGATIVES):.1%}): {flagged}"
    )
    assert not lost
    assert len(flagged) / len(NEGATIVES) <= 0.05


def test_speed_is_printed(scrubber):
    texts = [r["text"] for r in CORPUS]
    size_kb = sum(len(t.encode()) for t in texts) / 1024
    start = time.perf_counter()
    for text in texts:
        scrubber.scrub(text)
    elapsed_ms = (time.perf_counter() - start) * 1000
    print(
        f"\n{size_kb:.1f} KB in {elapsed_ms:.0f} ms: {elapsed_ms / size_kb:.1f} ms per KB "
        f"({elapsed_ms / len(texts):.2f} ms per message)"
    )
    assert elapsed_ms > 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Admitted on March 3, 1985 with chest pain.", "Admitted on [DATE], 1985 with chest pain."),
        ("DOB 04/12/1986", "DOB [DATE]/1986"),
        ("Seen 2023-06-05.", "Seen 2023-[DATE]."),
        ("She was born in 1931 and is frail.", "She was born in [AGE] and is frail."),
        ("He is 91 and I am 34.", "He is [AGE] and I am 34."),
        ("Call 617-555-0142 or fax 617-555-0199.", "Call [PHONE] or fax [FAX]."),
    ],
)
def test_placeholders_keep_years_and_types(scrubber, text, expected):
    assert scrubber.scrub(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Sam shares 180 cookies among 9 friends.", "[NAME] shares 180 cookies among 9 friends."),
        ("Tom has 40 shells. Lily had 51.", "[NAME] has 40 shells. [NAME] had 51."),
        ("Mark the date. Will has a plan.", "Mark the date. Will has a plan."),  # words first
    ],
)
def test_a_first_name_opening_a_sentence_as_a_subject_is_a_name(scrubber, text, expected):
    assert scrubber.scrub(text) == expected


def test_find_reports_exact_spans(scrubber):
    text = "I'm Daniel Cohen, email dan.cohen@example.org, MRN 00482913."
    found = scrubber.find(text)
    assert [f.type for f in found] == ["NAME", "EMAIL", "MRN"]
    assert all(isinstance(f, Finding) and text[f.start : f.end] == f.text for f in found)
    assert found[0].text == "Daniel Cohen"
    assert scrubber.find("") == [] and scrubber.scrub("   ") == "   "


def test_scrub_messages_returns_new_scrubbed_dicts(scrubber):
    messages = [
        {"role": "system", "content": "You are a triage assistant."},
        {"role": "user", "name": "Maria Lopez", "content": "My name is Maria Lopez, fever 38.5 C."},
        {"role": "user", "content": [{"type": "text", "text": "Call me at 305.555.0163"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "kb_search",
                        "arguments": '{"query": "Maria Lopez fever", "k": 2}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Seek care if fever lasts 3 days."},
    ]
    before = json.dumps(messages)
    out = scrubber.scrub_messages(messages)
    assert json.dumps(messages) == before  # the input is untouched
    assert out[0] == messages[0] and out[4] == messages[4]
    assert out[1]["content"] == "My name is [NAME], fever 38.5 C."
    assert out[1]["name"] == "[NAME]"
    assert out[2]["content"][0]["text"] == "Call me at [PHONE]"
    args = json.loads(out[3]["tool_calls"][0]["function"]["arguments"])
    assert args == {"query": "[NAME] fever", "k": 2}


def test_threads_share_one_scrubber(scrubber):
    texts = [r["text"] for r in CORPUS[:120]]
    expected = [scrubber.scrub(t) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(scrubber.scrub, texts * 2))
    assert got == expected * 2


def test_serving_import_stays_free_of_torch():
    code = (
        "import sys; from agents.pii import PhiScrubber; s = PhiScrubber(); "
        "assert s.scrub('Dr. Jane Roe') == 'Dr. [NAME]'; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
