"""Figures the gate computes with the models themselves, on logged token ids (never re-tokenised).

`divergence`: exact per-token KL(candidate || reference) over the whole vocabulary, and both
policies' token entropies, on the candidate's own eval completions. `token_logprobs`: each
logged completion's per-token log-probabilities under a model (for importance weights).
`gather`: every figure the guards need for one version. The candidate and the reference (the
base model, v0: what LoRA training's KL penalty is anchored to) are loaded with the learner's
own loaders and scored on the logged token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agents.events import TrajectoryEvent
from learner.gate.evidence import importance_gain, log_ratios, logged_runs, off_policy_estimate
from learner.gate.guards import GuardEvidence
from learner.gate.ope import OPEEstimate
from learner.judge import read_source_scores
from learner.logprobs import completion_log_softmax, make_batch, selected_logprobs
from learner.policy.models import fetch_checkpoint, load_version
from learner.policy.registry import BASE_VERSION, PolicyRegistry
from learner.store import Store, chunks

Tokens = tuple[Sequence[int], Sequence[int]]  # (prompt ids, completion ids)


@dataclass(frozen=True)
class Divergence:
    """Means over every completion token of the sequences compared."""

    kl: float  # KL(candidate || reference), nats per token
    candidate_entropy: float
    reference_entropy: float
    tokens: int


def divergence(
    candidate: torch.nn.Module,
    reference: torch.nn.Module,
    sequences: Sequence[Tokens],
    pad_id: int,
    micro_batch: int = 4,
) -> Divergence | None:
    """KL and entropies on the completion tokens; None when there is no token to compare."""
    sums = torch.zeros(3, dtype=torch.float64)  # kl, H(candidate), H(reference)
    count = 0
    for chunk in chunks([s for s in sequences if len(s[0]) and len(s[1])], micro_batch):
        batch = make_batch([p for p, _ in chunk], [c for _, c in chunk], pad_id)
        with torch.no_grad():
            lp_c = completion_log_softmax(candidate, batch)  # (N, V)
            lp_r = completion_log_softmax(reference, batch)  # (N, V)
        p_c = lp_c.exp()  # (N, V)
        sums[0] += float((p_c * (lp_c - lp_r)).sum())
        sums[1] += float(-(p_c * lp_c).sum())
        sums[2] += float(-(lp_r.exp() * lp_r).sum())
        count += lp_c.shape[0]
    if count == 0:
        return None
    kl, h_c, h_r = (sums / count).tolist()
    return Divergence(max(kl, 0.0), h_c, h_r, count)


def token_logprobs(
    model: torch.nn.Module, sequences: Sequence[Tokens], pad_id: int, micro_batch: int = 8
) -> list[torch.Tensor]:
    """Per sequence, the (C,) log-probabilities of its completion tokens under `model`."""
    out: list[torch.Tensor] = []
    for chunk in chunks(list(sequences), micro_batch):
        batch = make_batch([p for p, _ in chunk], [c for _, c in chunk], pad_id)
        with torch.no_grad():
            picked, _ = selected_logprobs(model, batch)  # (N,)
        out += list(picked.split([len(c) for _, c in chunk]))
    return out


MAX_DIVERGENCE_SEQUENCES = 64
"""KL and entropies are means over tokens: 64 model calls (~1000 tokens) measure them well, and
each costs two full forward passes on the learner's CPU."""


def spread(items: list, most: int) -> list:
    """At most `most` items, evenly spaced over the list (every task kind stays represented)."""
    if len(items) <= most:
        return items
    return [items[i * len(items) // most] for i in range(most)]


def gather(
    registry: PolicyRegistry,
    store: Store | None,
    version: str,
    trajectories: list[TrajectoryEvent],
    *,
    max_user_share: float,
    ope_runs: int,
    min_ess: float,
    model_cache: Path,
) -> tuple[GuardEvidence, OPEEstimate | None, dict[str, Any]]:
    """(guard evidence, off-policy estimate, training summary) for `version`.

    `trajectories` are the version's eval runs; the store (when there is one) gives its
    training batch and the held-out logged traffic it was not trained on.
    """
    record = registry.get(version)
    candidate, tokenizer = load_version(record, cache_dir=model_cache)
    reference, _ = load_version(registry.get(BASE_VERSION), cache_dir=model_cache)
    pad = tokenizer.pad_token_id
    sequences = [
        (s.prompt_token_ids, s.completion_token_ids)
        for t in trajectories
        for s in t.model_steps
        if s.prompt_token_ids and s.completion_token_ids
    ]
    div = divergence(candidate, reference, spread(sequences, MAX_DIVERGENCE_SEQUENCES), pad)

    def candidate_logprobs(seqs):
        return token_logprobs(candidate, seqs, pad)

    evidence = GuardEvidence(
        kl=div.kl if div else None,
        candidate_entropy=div.candidate_entropy if div else None,
        reference_entropy=div.reference_entropy if div else None,
        divergence_tokens=div.tokens if div else 0,
        clip_ratio=record.metrics.get("clip_ratio"),
    )
    if store is None:
        return evidence, None, {"trained_runs": 0, "note": "no learner store: training guards n/a"}
    trained = logged_runs(store.trained_runs(version), max_user_share)
    rewarded = [r for r in trained if r.reward is not None and r.answer_tokens is not None]
    complete = [r for r in trained if r.reward is not None and r.complete]
    gain = (
        importance_gain([r.reward for r in complete], log_ratios(complete, candidate_logprobs))
        if complete
        else None
    )
    held_out = store.rewarded_runs(limit=ope_runs, not_trained_by=version)
    ope = off_policy_estimate(logged_runs(held_out, max_user_share), candidate_logprobs, min_ess)
    evidence = replace(
        evidence,
        train_rewards=[r.reward for r in rewarded],
        train_lengths=[r.answer_tokens for r in rewarded],
        train_gain=gain,
        source_scores={
            **{r.trajectory_id: r.sources for r in trained if r.sources},
            **_round_source_scores(record, model_cache),
        },
    )
    training = {
        "trained_runs": len(trained),
        "rewarded_runs": len(rewarded),
        "reward_mean": sum(r.reward for r in rewarded) / len(rewarded) if rewarded else None,
        "importance_gain": gain,
        "reward_sources": sorted({k for r in trained for k in r.sources}),
    }
    return evidence, ope, training


def _round_source_scores(record: Any, model_cache: Path) -> dict[str, dict[str, float]]:
    """Verdicts the version's round wrote beside its checkpoint: its reward model against the
    verifier on the verified replays (`learner.judge`); {} for v0 or a round without one."""
    if not record.checkpoint_uri or record.checkpoint_kind == "base":
        return {}
    return read_source_scores(fetch_checkpoint(record, model_cache))  # s3://: fetched, checked
