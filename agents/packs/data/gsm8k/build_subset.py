"""Rebuild `subset.jsonl` from GSM8K's `train.jsonl`: `python build_subset.py PATH/train.jsonl`.

Keeps, in file order, the first 400 problems whose worked solution has at most two calculator
annotations (`<<...>>`) and whose answer is a whole number from 0 to 10,000; every fourth of
them (index % 4 == 3) is the held-out eval split, the rest are training problems.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP, MAX_STEPS = 400, 2


def wanted(row: dict) -> bool:
    answer = row["answer"].split("####")[-1].strip().replace(",", "")
    try:
        value = float(answer)
    except ValueError:
        return False
    return row["answer"].count("<<") <= MAX_STEPS and value.is_integer() and 0 <= value <= 10_000


def main(source: Path) -> None:
    rows = [json.loads(line) for line in source.open(encoding="utf-8")]
    kept = [r for r in rows if wanted(r)][:KEEP]
    out = Path(__file__).with_name("subset.jsonl")
    with out.open("w", encoding="utf-8") as f:
        for i, r in enumerate(kept):
            record = {
                "id": f"gsm8k-{i:03d}",
                "split": "eval" if i % 4 == 3 else "train",
                "question": r["question"],
                "answer": r["answer"],
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {len(kept)} problems to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
