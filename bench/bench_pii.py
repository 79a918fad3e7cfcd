"""The PHI scrubber on the project's probe sets: identifiers caught, false positives, speed.

For each probe corpus in `tests/agents/pii/` (the main corpus, the casual one, the identifier
shapes' dev and three held-out sets): identifiers caught / planted (the raw value no longer in the
scrubbed text), clinical facts kept, and negatives with any finding. On the packs' own texts
(tutoring problems, GSM8K, triage cases and probes): findings by type, and how many are not
names. Speed: milliseconds per message over every probe message, the median of `--passes`
passes after a warm-up, on one thread (the scrubber runs off the event loop, once per run).

    .venv/bin/python bench/bench_pii.py [--passes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.packs.maths_problems import gsm8k, template_eval, template_train  # noqa: E402
from agents.packs.triage_cases import cases  # noqa: E402
from agents.pii import PhiScrubber  # noqa: E402

PROBES = ROOT / "tests" / "agents" / "pii"
CORPORA = (
    "phi_corpus",
    "casual_corpus",
    "shapes_dev",
    "shapes_held_out",
    "shapes_held_out_2",
    "shapes_held_out_3",
)


def _rows(name: str) -> list[dict]:
    path = PROBES / f"{name}.jsonl"
    return [json.loads(line) for line in path.open(encoding="utf-8")] if path.exists() else []


def _recall(scrubber: PhiScrubber, rows: list[dict]) -> str:
    caught = planted = lost = facts = flagged = negatives = 0
    for row in rows:
        out = scrubber.scrub(row["text"])
        planted += len(row["identifiers"])
        caught += sum(i["value"] not in out for i in row["identifiers"])
        facts += len(row.get("keep", ()))
        lost += sum(k not in out for k in row.get("keep", ()))
        if not row["identifiers"]:
            negatives += 1
            flagged += bool(scrubber.find(row["text"]))
    return (
        f"caught {caught}/{planted} ({caught / max(planted, 1):.3f}), facts kept "
        f"{facts - lost}/{facts}, negatives flagged {flagged}/{negatives}"
    )


def _packs_texts() -> dict[str, list[str]]:
    probes = ROOT / "agents" / "packs" / "data" / "triage_probe.jsonl"
    texts = {
        "tutoring templates": [p.question for p in template_eval(480)]
        + [p.question for p in template_train(480, 0, set())],
        "gsm8k": [p.question for p in gsm8k("train")] + [p.question for p in gsm8k("eval")],
        "triage cases": [c.message for c in cases("train")] + [c.message for c in cases("eval")],
        "triage probes": [json.loads(line)["message"] for line in probes.open(encoding="utf-8")],
    }
    return {k: list(dict.fromkeys(v)) for k, v in texts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    scrubber = PhiScrubber()
    print(f"built in {time.perf_counter() - start:.1f} s")
    messages = []
    for name in CORPORA:
        rows = _rows(name)
        messages += [r["text"] for r in rows]
        if rows:
            print(f"{name}: {len(rows)} messages, {_recall(scrubber, rows)}")
    for name, texts in _packs_texts().items():
        kinds = Counter(f.type for t in texts for f in scrubber.find(t))
        lower = sum(f.text[:1].islower() for t in texts for f in scrubber.find(t))
        others = sum(n for k, n in kinds.items() if k != "NAME")
        print(f"{name}: {len(texts)} texts, {dict(kinds)}, not names {others}, lower-case {lower}")
    per_message = []
    for _ in range(args.passes):
        start = time.perf_counter()
        for text in messages:
            scrubber.scrub(text)
        per_message.append((time.perf_counter() - start) * 1000 / len(messages))
    print(
        f"speed: {len(messages)} probe messages, {statistics.median(per_message):.2f} ms per "
        f"message (median of {args.passes} passes; min {min(per_message):.2f})"
    )


if __name__ == "__main__":
    main()
