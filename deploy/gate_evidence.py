"""The gate's figures that need the models: KL and entropy on eval completions, importance weights.

The candidate and the reference (the base model, v0: what LoRA training's KL penalty is
anchored to) are loaded with the learner's own loaders and scored on the logged token ids.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agents.events import TrajectoryEvent
from learner.eval_figures import divergence, token_logprobs
from learner.guards import GuardEvidence
from learner.models import load_version
from learner.ope import OPEEstimate
from learner.registry import BASE_VERSION
from learner.training_evidence import (
    importance_gain,
    log_ratios,
    logged_runs,
    off_policy_estimate,
)

if TYPE_CHECKING:
    from deploy.eval_runner import GateRunner


MAX_DIVERGENCE_SEQUENCES = 64
"""KL and entropies are means over tokens: 64 model calls (~1000 tokens) measure them well, and
each costs two full forward passes on the learner's CPU."""


def spread(items: list, most: int) -> list:
    """At most `most` items, evenly spaced over the list (every task kind stays represented)."""
    if len(items) <= most:
        return items
    return [items[i * len(items) // most] for i in range(most)]


def gather(
    gate: GateRunner, version: str, trajectories: list[TrajectoryEvent]
) -> tuple[GuardEvidence, OPEEstimate | None, dict[str, Any]]:
    """(guard evidence, off-policy estimate, training summary) for `version`."""
    record = gate.registry.get(version)
    candidate, tokenizer = load_version(record)
    reference, _ = load_version(gate.registry.get(BASE_VERSION))
    pad = tokenizer.pad_token_id
    sequences = [(s.prompt_token_ids, s.completion_token_ids) for t in trajectories
                 for s in t.model_steps if s.prompt_token_ids and s.completion_token_ids]  # fmt: skip
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
    if gate.store is None:
        return evidence, None, {"trained_runs": 0, "note": "no learner store: training guards n/a"}
    trained = logged_runs(gate.store.trained_runs(version), gate.max_user_share)
    rewarded = [r for r in trained if r.reward is not None and r.answer_tokens is not None]
    complete = [r for r in trained if r.reward is not None and r.complete]
    gain = (importance_gain([r.reward for r in complete], log_ratios(complete, candidate_logprobs))
            if complete else None)  # fmt: skip
    held_out = gate.store.rewarded_runs(limit=gate.ope_runs, not_trained_by=version)
    ope = off_policy_estimate(logged_runs(held_out, gate.max_user_share), candidate_logprobs,
                              gate.config.min_ess)  # fmt: skip
    evidence = replace(
        evidence,
        train_rewards=[r.reward for r in rewarded],
        train_lengths=[r.answer_tokens for r in rewarded],
        train_gain=gain,
        source_scores={r.trajectory_id: r.sources for r in trained if r.sources},
    )  # fmt: skip
    training = {
        "trained_runs": len(trained),
        "rewarded_runs": len(rewarded),
        "reward_mean": sum(r.reward for r in rewarded) / len(rewarded) if rewarded else None,
        "importance_gain": gain,
        "reward_sources": sorted({k for r in trained for k in r.sources}),
    }
    return evidence, ope, training
