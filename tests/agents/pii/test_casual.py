"""Casual patient messages: lower-case, nickname and international first names.

`casual_corpus.jsonl` was written for this check, not taken from the main corpus: batch `dev`
(54 messages) before the casual-name rules, which then were written against it (names caught
10 of 47 before them); batch `held-out` (40 messages) after the rules, measured once (names 31
of 35 then, 32 after fixing the word-boundary bug it exposed; 7 of 35 without the rules), and
kept for regressions, not for tuning (40 of 41 after the shape rules of `test_shapes.py`, whose
sign-off, possessive and epithet contexts took gemma, elena and ted; its misses had been seen,
so that is no held-out figure). Run with `-s` for the tables.
The packs' own texts (tutoring problems, GSM8K, triage cases) hold names only capitalised:
the casual rules must flag no lower-case word there.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agents.packs.maths_problems import gsm8k, template_eval, template_train
from agents.packs.triage_cases import cases
from agents.pii import PhiScrubber

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "casual_corpus.jsonl").open()]
FLOOR = {"dev": 0.94, "held-out": 0.97}  # measured 56/59 and 40/41


@pytest.fixture(scope="module")
def scrubber() -> PhiScrubber:
    return PhiScrubber()


@pytest.mark.parametrize("batch", list(FLOOR))
def test_casual_identifiers_are_caught(scrubber, batch):
    hit, total, missed = Counter(), Counter(), []
    for row in (r for r in CORPUS if r["batch"] == batch):
        out = scrubber.scrub(row["text"])
        for ident in row["identifiers"]:
            total[ident["type"]] += 1
            caught = ident["value"] not in out
            hit[ident["type"]] += caught
            if not caught:
                missed.append((ident["type"], ident["value"]))
    print(f"\n{batch}: " + ", ".join(f"{t} {hit[t]}/{total[t]}" for t in sorted(total)))
    recall = sum(hit.values()) / sum(total.values())
    print(
        f"{batch}: recall {sum(hit.values())}/{sum(total.values())} = {recall:.3f}; missed {missed}"
    )
    assert recall >= FLOOR[batch], missed


def test_the_packs_texts_get_no_lower_case_findings(scrubber):
    texts = {
        "tutoring templates": [p.question for p in template_eval(480)]
        + [p.question for p in template_train(480, 0, set())],
        "gsm8k": [p.question for p in gsm8k("train")] + [p.question for p in gsm8k("eval")],
        "triage cases": [c.message for c in cases("train")] + [c.message for c in cases("eval")],
    }
    lower: list[tuple[str, str]] = []
    for name, items in texts.items():
        items = list(dict.fromkeys(items))
        findings = [(f.type, f.text) for t in items for f in scrubber.find(t)]
        flagged = sum(1 for t in items if scrubber.find(t))
        lower += [f for f in findings if f[1][:1].islower()]
        print(
            f"\n{name}: {len(items)} texts, {flagged} with a finding, {Counter(t for t, _ in findings)}"
        )
    assert lower == []
    assert not any(scrubber.find(t) for t in texts["triage cases"])
