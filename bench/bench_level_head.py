"""The triage level head (`learner.policy.heads`): how right it is on messages it never saw.

Two measurements, on the default model's base (SmolLM2-135M-Instruct, fp32, this CPU):

1. Labels -> accuracy. Heads fitted on N of the medical pack's training cases with their true
   level (as a clinician's disposition labels them), N in `--labels`, `--draws` random draws
   each, scored on: the pack's eval split (other phrasings of other symptoms), the probe set
   (`agents/packs/data/triage_probe.jsonl`) and the blind sets written from public guidance by
   people who had not read the rules (`triage_heldout*.jsonl`). The peer in the same run: the
   majority level of the same N labels (what a head that learnt only the label counts would
   say), so a gain over it is the hidden states' doing.
2. `--checkpoint DIR` (a version's checkpoint folder, e.g. one a demo published): that
   version's own head, fitted on the labels the demo's feedback gave, on the same sets.

The follow-up cases (`ask`) are left out: a head chooses a level, the rules ask.

    .venv/bin/python bench/bench_level_head.py [--labels 6 12 24 48] [--draws 5]
        [--checkpoint DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from agents.packs.triage_cases import cases
from deploy.settings import ModelSettings
from learner.policy.heads import Head, features, fit, head_layer, read_heads
from learner.policy.models import SMOLLM2, load_base
from tools.verifiers import LEVELS

DATA = ROOT / "agents" / "packs" / "data"


def held_out_sets() -> dict[str, list[tuple[str, str]]]:
    """(message, level) per set, `ask` cases left out."""

    def jsonl(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    blind = [r for p in sorted(DATA.glob("triage_heldout*.jsonl")) for r in jsonl(p)]
    return {
        "eval split": [(c.message, c.level) for c in cases("eval") if c.level in LEVELS],
        "probe set": [(r["message"], r["level"]) for r in jsonl(DATA / "triage_probe.jsonl")],
        "blind sets": [(r["message"], r["level"]) for r in blind if r["level"] in LEVELS],
    }


def accuracy(head: Head, x: torch.Tensor, levels: list[str]) -> float:
    return sum(head.predict(x[i])[0] == y for i, y in enumerate(levels)) / len(levels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", type=int, nargs="+", default=[6, 12, 24, 48])
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--checkpoint", type=Path, help="a version's checkpoint folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    model, tokenizer = load_base(SMOLLM2, cache_dir=ModelSettings().model_cache)
    layer = head_layer(model.config)
    started = time.perf_counter()
    train = [(c.message, c.level) for c in cases("train") if c.level in LEVELS]
    x_train = features(model, tokenizer, [m for m, _ in train], layer)
    sets = held_out_sets()
    xs = {
        name: features(model, tokenizer, [m for m, _ in rows], layer) for name, rows in sets.items()
    }
    texts = len(train) + sum(len(r) for r in sets.values())
    per_text = (time.perf_counter() - started) / texts
    print(f"features: {texts} messages, {per_text * 1000:.0f} ms each (layer {layer})")
    print("held-out sets: " + ", ".join(f"{k} {len(v)}" for k, v in sets.items()))
    figures: dict = {"ms_per_message": round(per_text * 1000, 1), "curve": {}}
    print(f"\n{'labels':>6}  " + "  ".join(f"{k:>22}" for k in sets))
    for n in opts.labels:
        row = {}
        for name, rows in sets.items():
            levels = [y for _, y in rows]
            heads, majority = [], []
            for draw in range(opts.draws):
                picked = random.Random(draw).sample(range(len(train)), n)
                examples = [(str(i), train[i][1], x_train[i]) for i in picked]
                head = fit(Head("level", list(LEVELS), layer).with_examples(examples))
                heads.append(accuracy(head, xs[name], levels) if head.fitted else 0.0)
                top = Counter(train[i][1] for i in picked).most_common(1)[0][0]
                majority.append(levels.count(top) / len(levels))
            row[name] = {"head": statistics.mean(heads), "majority": statistics.mean(majority)}
        figures["curve"][n] = row
        print(
            f"{n:>6}  "
            + "  ".join(f"{r['head']:>6.0%} (majority {r['majority']:>4.0%})" for r in row.values())
        )
    if opts.checkpoint:
        head = read_heads(opts.checkpoint).get("level")
        if head is None or not head.fitted:
            sys.exit(f"{opts.checkpoint} has no fitted level head")
        counts = Counter(e["label"] for e in head.examples)
        own = {name: accuracy(head, xs[name], [y for _, y in rows]) for name, rows in sets.items()}
        figures["checkpoint"] = {"examples": dict(counts), "accuracy": own}
        print(f"\n{opts.checkpoint}: a head fitted on {len(head.examples)} labels {dict(counts)}")
        print("  " + ", ".join(f"{k} {v:.0%}" for k, v in own.items()))
    if opts.json:
        opts.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
