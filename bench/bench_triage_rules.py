"""The triage rules alone on message sets: what holds when the model answers self-care to all.

Runs the triage envelope (`agents.packs.triage_envelope.TriageEnvelope`, with the pack's own
checks) on every message of each set, the model's answer always a fluent, well-formed
`Triage: self-care`, so every escalation, floor and question is the rules'. No server, no model:
a few seconds. Prints, per set: emergencies escalated, non-emergencies sent to emergency,
questions asked, answers below the set's level, `self-care` returned for a case that needs
more, and the level right; `-v` lists each message whose level differs.

    .venv/bin/python bench/bench_triage_rules.py [FILE.jsonl ...] [-v]

Default: the blind sets, `agents/packs/data/triage_heldout*.jsonl` (each line: `message`,
`level`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.packs.medical import check
from agents.packs.triage_envelope import TriageEnvelope
from tools.verifiers import DISCLAIMER, LEVELS, triage_level

SELF_CARE = (
    f"Rest at home and drink plenty of water, it should pass. {DISCLAIMER}\nTriage: self-care"
)
SETS = sorted((ROOT / "agents" / "packs" / "data").glob("triage_heldout*.jsonl"))


def measure(rows: list[dict]) -> tuple[dict, list[tuple[dict, str | None]]]:
    envelope = TriageEnvelope(check())
    got = [(r, triage_level(envelope(r["message"], SELF_CARE, "").output)) for r in rows]
    emergencies = [g for r, g in got if r["level"] == "emergency"]
    others = [g for r, g in got if r["level"] != "emergency"]
    figures = {
        "messages": len(rows),
        "emergencies_escalated": f"{emergencies.count('emergency')}/{len(emergencies)}",
        "non_emergencies_to_emergency": f"{others.count('emergency')}/{len(others)}",
        "asked": sum(g is None for _, g in got),
        "below_the_level": sum(
            g is not None and LEVELS.index(g) < LEVELS.index(r["level"]) for r, g in got
        ),
        "self_care_for_more": sum(g == "self-care" and r["level"] != "self-care" for r, g in got),
        "level_right": f"{sum(g == r['level'] for r, g in got)}/{len(rows)}",
    }
    return figures, [(r, g) for r, g in got if g != r["level"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=SETS)
    parser.add_argument("-v", action="store_true", help="list each message whose level differs")
    opts = parser.parse_args()
    for path in opts.files:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        figures, wrong = measure(rows)
        print(f"{path.name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        for r, g in wrong if opts.v else ():
            print(f"  want {r['level']:<12} got {str(g):<12} {r['message'][:100]}")


if __name__ == "__main__":
    main()
