"""A round's decision heads: each agent's `Decision` head refitted on every label so far.

The parent version's heads keep the examples they were fitted on; this round's labels (on
prompts of an agent whose pack names a decision, with an answer among its labels) are added,
and each head is fitted again (`learner.policy.heads`). The new version carries the heads in
its checkpoint folder, so the policy server serves the head of the version it serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from learner.episodes import Episode
from learner.labels import Grounding, Label
from learner.policy.heads import Head, features, fit, head_layer, prompt_digest, read_heads
from learner.policy.models import load_base
from learner.policy.registry import PolicyVersion
from learner.policy.storage import fetch_checkpoint

HEADS_KEY = "decision_heads"
"""The learner store's meta key of every decision example so far (committed with the ledger)."""


def parent_heads(parent: PolicyVersion, model_cache: Path) -> dict[str, Head]:
    """The heads the version a round starts from carries (none for the base)."""
    if parent.checkpoint_kind == "base":
        return {}
    return read_heads(fetch_checkpoint(parent, model_cache))


def decision_examples(
    episodes: Sequence[Episode], labels: Mapping[str, Label], grounding: Mapping[str, Grounding]
) -> dict[str, list[tuple[str, str, str]]]:
    """Per decision name, this round's (prompt digest, label, the user's message)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for key in sorted(labels):
        label = labels[key]
        agent = key.split("\x1f", 1)[0]
        decision = grounding[agent].decision if agent in grounding else None
        if decision is None or label.answer not in decision.labels or not label.episodes:
            continue
        text = episodes[label.episodes[0]].trajectory.case  # what the head read serving it
        out.setdefault(decision.name, []).append((prompt_digest(key), label.answer, text))
    return out


def refit_heads(
    parent: PolicyVersion,
    found: Mapping[str, list[tuple[str, str, str]]],
    kept: Mapping[str, dict],
    grounding: Mapping[str, Grounding],
    model_cache: Path,
) -> tuple[dict[str, Head], dict[str, float]]:
    """(the new version's heads, their metrics): every example so far, this round's added.

    Every example so far: the parent's head's, and those the learner's store keeps (`kept`,
    `HEADS_KEY`: a head as `kept_heads` writes it), so the labels of a round whose version
    was rejected, or is not yet released, are not lost to the next."""
    heads = parent_heads(parent, model_cache)
    for name, state in kept.items():
        head = heads.get(name) or Head(name, list(state["labels"]), int(state["layer"]))
        heads[name] = Head(
            name, head.labels, head.layer, examples=head.examples + state["examples"]
        )
        heads[name] = heads[name].with_examples([])  # a prompt's latest label wins
    decisions = {g.decision.name: g.decision for g in grounding.values() if g.decision is not None}
    metrics: dict[str, float] = {}
    base = load_base(parent.base_model, cache_dir=model_cache) if found else None
    for name, rows in sorted(found.items()):
        head = heads.get(name) or Head(
            name, list(decisions[name].labels), head_layer(base[0].config)
        )
        x = features(base[0], base[1], [text for _, _, text in rows], head.layer)  # (N, H)
        heads[name] = head.with_examples([(p, y, x[i]) for i, (p, y, _) in enumerate(rows)])
        metrics[f"decision/{name}/new_labels"] = float(len(rows))
    heads = {name: fit(head) for name, head in sorted(heads.items())}
    for name, head in heads.items():
        metrics[f"decision/{name}/examples"] = float(len(head.examples))
        if head.fitted:
            right = sum(head.predict(_row(e))[0] == e["label"] for e in head.examples)
            metrics[f"decision/{name}/train_accuracy"] = right / len(head.examples)
    return heads, metrics


def kept_heads(heads: Mapping[str, Head]) -> dict[str, dict]:
    """What the learner's store keeps of the heads (`HEADS_KEY`): their examples, no weights."""
    return {
        name: {"labels": h.labels, "layer": h.layer, "examples": h.examples}
        for name, h in heads.items()
    }


def _row(example: dict) -> torch.Tensor:
    return torch.tensor(example["x"], dtype=torch.float64)  # (H,)
