"""Verified on-policy sub-rounds: labelled prompts resampled, checked, and learned from.

Inside one round, after the update on the feedback's own rewards, each sub-round:
1. resamples every labelled prompt `resample_n` times from the weights being trained, through
   the agent's real tools (`learner.resample`), and scores each run 1 or 0: does its final
   answer equal the label;
   a prompt none of whose runs reached it is run `hint_n` times more with the label stated
   in the prompt (`learner.resample.hinted`); a run that reached it through a tool's output,
   not by copying the hint (`derived`), joins the group scored 1, trained on the prompt
   without the hint and with weight 1 (no behaviour logprobs: the hint's policy is not the
   student's), so a group that all failed still has a success to learn from;
2. in the first sub-round the served runs of those prompts join their groups, scored against
   the same label (their users' judgements are already in it), with their logged logprobs:
   the trainer's truncated importance weight handles that they came from an older policy;
3. centres each group's rewards on the group mean and divides by the batch's reward std;
4. updates in equal-size optimiser steps of `batch_size` samples.
A correction becomes a DPO pair only here: a run that used a tool and reached the label is
the chosen side, the served reply the rejected one; without such a run it stays a label.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agents.events import FeedbackKind, ModelStep
from learner.config import RoundConfig
from learner.crashpoints import crash_point
from learner.episodes import Episode
from learner.labels import Grounding, Label
from learner.policy.registry import version_number
from learner.resample import Replay, Start, derived, faithful, hinted, replay
from learner.samples import PreferencePair, Sample, reads_tool_output
from learner.store import even_chunks


@dataclass(frozen=True)
class Sampling:
    """How the agents sample from the policy server (the learner resamples alike)."""

    temperature: float = 1.0
    max_tokens: int = 64


@dataclass
class SubroundResult:
    """What the sub-rounds trained on and measured."""

    used: set[int] = field(default_factory=set)
    """Episodes whose prompt was replayed: they count as trained on."""
    pairs: list[PreferencePair] = field(default_factory=list)
    updates: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    samples: int = 0
    judged: list[tuple[float, float]] = field(default_factory=list)
    """(verifier, reward model) verdicts, ±1 each, on the first sub-round's resampled runs."""


@dataclass(frozen=True)
class Replays:
    """The labelled prompts a round replays, and the episodes (served runs) of each."""

    starts: list[Start]
    members: list[tuple[int, ...]]
    labels: int
    confidence: float

    @property
    def episodes(self) -> set[int]:
        return {i for group in self.members for i in group}


def plan_replays(
    episodes: Sequence[Episode],
    labels: Mapping[str, Label],
    grounding: Mapping[str, Grounding],
    config: RoundConfig,
    tokenizer: Any,
) -> Replays:
    """The prompts to replay, most confident first: at most `max_resample_prompts`, each with a
    logged first call that renders faithfully."""
    starts, members = [], []
    ranked = sorted(labels.values(), key=lambda lb: (-lb.confidence, lb.prompt))
    for label in ranked:
        if len(starts) == config.max_resample_prompts:
            break
        episode = episodes[label.episodes[0]]
        step = _first_step(episode)
        if step is None:
            continue
        start = Start(step, grounding[episode.trajectory.agent], label.answer, label.prompt)
        if faithful(start, tokenizer):
            starts.append(start)
            members.append(label.episodes)
    confidence = _mean([lb.confidence for lb in labels.values()])
    return Replays(starts, members, len(labels), confidence)


def run_subrounds(
    trainer: Any,
    tokenizer: Any,
    episodes: Sequence[Episode],
    replays: Replays,
    config: RoundConfig,
    sampling: Sampling,
    *,
    seed: int,
    current_version: int | None,
    check_stop: Callable[[], None],
    judge: Callable[[list[list[int]], list[list[int]]], list[float]] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> SubroundResult:
    """`config.subrounds` verified updates on the labelled prompts (see the module's steps).

    `judge` (the round's reward model) scores the first sub-round's runs too, before any of
    its updates: how often it disagrees with the verifier is measured where both can judge.
    """
    out = SubroundResult()
    starts, members = replays.starts, replays.members
    out.metrics.update({"labels": float(replays.labels), "labels/replayed": float(len(starts))})
    if replays.labels:
        out.metrics["labels/confidence"] = replays.confidence
    if not starts or config.subrounds == 0:
        return out
    first_runs: list[list[Replay]] = []
    solved, generation_s, update_s, verified, hints_tried, hints_kept = [], 0.0, 0.0, 0, 0, 0
    for s in range(config.subrounds):
        check_stop()
        n = f"sub-round {s + 1}/{config.subrounds}"
        say(
            f"{n}: resampling {len(starts)} labelled prompts x {config.resample_n} through the tools"
        )
        t = time.perf_counter()
        runs = replay(
            trainer.model,
            tokenizer,
            starts,
            n=config.resample_n,
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            seed=seed * 1009 + s,
            max_batch_size=config.resample_batch_size,
        )
        first_runs = first_runs or runs
        rows = [
            (start.key, float(run.solved), _turn_rows(run, config))
            for start, choices in zip(starts, runs, strict=True)
            for run in choices
        ]
        verified += len(rows)
        solved.append(_mean([r for _, r, _ in rows]))
        hints = _hinted_rows(trainer.model, tokenizer, starts, runs, config, sampling, seed, s)
        generation_s += time.perf_counter() - t
        verified += hints.tried
        hints_tried, hints_kept = hints_tried + hints.tried, hints_kept + len(hints.rows)
        rows += hints.rows
        if s == 0 and judge is not None:
            out.judged = _judge_runs(judge, [run for choices in runs for run in choices])
            disagree = _mean([abs(v - r) / 2 for v, r in out.judged])
            out.metrics["reward_model/verifier_disagreement"] = disagree
            out.metrics["reward_model/verifier_runs"] = float(len(out.judged))
        if s == 0:
            served = [
                (start.key, float(_says(episodes[i], start)), _served_rows(episodes[i], config))
                for start, group in zip(starts, members, strict=True)
                for i in group
            ]
            rows += served
            out.metrics["reward_sources/label_served"] = float(len(served))
        samples = _samples(rows)
        t = time.perf_counter()
        if any(x.advantage != 0.0 for x in samples):
            hint = f" (+{len(hints.rows)} of {hints.tried} hinted)" if hints.tried else ""
            say(f"{n}: solved {solved[-1]:.0%}{hint}; updating on {len(samples)} samples")
            for chunk in even_chunks(samples, config.batch_size):
                check_stop()
                out.updates.append(trainer.step(chunk, current_version=current_version))
            out.samples += len(samples)
        update_s += time.perf_counter() - t
        crash_point("during_subround")
    out.used = replays.episodes
    out.pairs, unpaired = _correction_pairs(episodes, starts, members, first_runs)
    out.metrics.update(
        {
            "reward_sources/verified": float(verified),
            "subround/solved_first": solved[0],
            "subround/solved_last": solved[-1],
            "subround/hinted": float(hints_tried),
            "subround/hinted_kept": float(hints_kept),
            "subround/generate_s": generation_s,
            "subround/update_s": update_s,
            "corrections/paired": float(len(out.pairs)),
            "corrections/label_only": float(unpaired),
        }
    )
    return out


@dataclass(frozen=True)
class Hinted:
    """A sub-round's hinted runs: how many were sampled, the rows of those that count."""

    tried: int
    rows: list[tuple[str, float, list[Row]]]


def _hinted_rows(
    model: Any,
    tokenizer: Any,
    starts: Sequence[Start],
    runs: Sequence[Sequence[Replay]],
    config: RoundConfig,
    sampling: Sampling,
    seed: int,
    subround: int,
) -> Hinted:
    """`hint_n` hinted runs of each start none of whose runs solved it; rows (scored 1, no
    logprobs) of those that solved it through a tool's output."""
    failed = [
        st for st, choices in zip(starts, runs, strict=True) if not any(r.solved for r in choices)
    ]
    hints = [h for h in map(hinted, failed) if h is not None] if config.hint_n else []
    if not hints:
        return Hinted(0, [])
    done = replay(
        model,
        tokenizer,
        hints,
        n=config.hint_n,
        temperature=sampling.temperature,
        max_tokens=sampling.max_tokens,
        seed=seed * 1009 + subround + 7919,  # not the unhinted runs' seeds
        max_batch_size=config.resample_batch_size,
    )
    rows = [
        (start.key, 1.0, [(p, c, None, None, False) for p, c, _, _, _ in _turn_rows(run, config)])
        for start, choices in zip(hints, done, strict=True)
        for run in choices
        if run.solved and derived(run, start.answer)
    ]
    return Hinted(len(hints) * config.hint_n, rows)


def _judge_runs(
    judge: Callable[[list[list[int]], list[list[int]]], list[float]], runs: Sequence[Replay]
) -> list[tuple[float, float]]:
    """(verifier, reward model) verdicts, ±1 each, on each run's final turn."""
    runs = [r for r in runs if r.turns and r.turns[-1].completion_ids]
    if not runs:
        return []
    scores = judge(
        [r.turns[-1].prompt_ids for r in runs], [r.turns[-1].completion_ids for r in runs]
    )
    return [
        (1.0 if r.solved else -1.0, 1.0 if score > 0 else -1.0)
        for r, score in zip(runs, scores, strict=True)
    ]


def _first_step(episode: Episode) -> ModelStep | None:
    steps = episode.trajectory.model_steps
    if steps and steps[0].prompt_token_ids and steps[0].completion_token_ids:
        return steps[0]
    return None


def _says(episode: Episode, start: Start) -> bool:
    # the model's own answer: an envelope's `emergency` is not the logged completion's
    return start.grounding.answer_of(episode.trajectory.model_answer) == start.answer


# prompt ids, completion ids, behaviour logprobs, policy version; and whether the logprobs are
# also the proximal's (a run this round generated: its weights are the proximal policy)
Row = tuple[list[int], list[int], list[float] | None, int | None, bool]


def _turn_rows(run: Replay, config: RoundConfig) -> list[Row]:
    """The turns of a resampled run that train (all, or those before a tool's output)."""
    turns = [t for t in run.turns if config.train_after_tool or not t.after_tool]
    return [
        (t.prompt_ids, t.completion_ids, t.logprobs, None, True) for t in turns if t.completion_ids
    ]


def _served_rows(episode: Episode, config: RoundConfig) -> list[Row]:
    t = episode.trajectory
    rows = []
    for step in t.model_steps:
        if not (step.prompt_token_ids and step.completion_token_ids):
            continue
        if not config.train_after_tool and reads_tool_output(t, step):
            continue
        logprobs = step.logprobs
        if logprobs is not None and len(logprobs) != len(step.completion_token_ids):
            logprobs = None
        version = version_number(step.policy_version)
        rows.append((step.prompt_token_ids, step.completion_token_ids, logprobs, version, False))
    return rows


def _samples(rows: list[tuple[str, float, list[Row]]]) -> list[Sample]:
    """Group-mean-centred, batch-std-scaled advantages, one Sample per trained turn."""
    rewards = torch.tensor([r for _, r, _ in rows], dtype=torch.float64)  # (R,)
    names = sorted({g for g, _, _ in rows})
    ids = torch.tensor([names.index(g) for g, _, _ in rows])  # (R,)
    count = torch.zeros(len(names), dtype=torch.float64).index_add(0, ids, torch.ones_like(rewards))
    mean = torch.zeros(len(names), dtype=torch.float64).index_add(0, ids, rewards) / count
    scale = rewards.std() + 1e-4 if len(rows) > 1 else torch.tensor(1.0, dtype=torch.float64)
    adv = ((rewards - mean[ids]) / scale).tolist()  # (R,)
    return [
        Sample(
            prompt_ids=list(prompt),
            completion_ids=list(completion),
            advantage=a,
            behaviour_logprobs=list(lp) if lp is not None else None,
            proximal_logprobs=list(lp) if lp is not None and generated else None,
            reward=r,
            group=group,
            policy_version=version,
        )
        for (group, r, turns), a in zip(rows, adv, strict=True)
        for prompt, completion, lp, version, generated in turns
    ]


def _correction_pairs(
    episodes: Sequence[Episode],
    starts: Sequence[Start],
    members: Sequence[tuple[int, ...]],
    runs: Sequence[Sequence[Replay]],
) -> tuple[list[PreferencePair], int]:
    """(pairs, corrections left as labels): chosen = a verified run that used a tool."""
    pairs, unpaired = [], 0
    for start, group, choices in zip(starts, members, runs, strict=True):
        good = next((r for r in choices if r.solved and r.used_tool and r.turns), None)
        for i in group:
            episode = episodes[i]
            if not any(f.kind is FeedbackKind.CORRECTION for f in episode.feedback):
                continue
            served = _first_step(episode)
            if good is None or served is None or _says(episode, start):
                unpaired += 1
                continue
            prompt, chosen = good.turns[0].prompt_ids, good.turns[0].completion_ids
            if prompt != served.prompt_token_ids or chosen == served.completion_token_ids:
                unpaired += 1  # another wording of the prompt, or the same reply
                continue
            pairs.append(PreferencePair(list(prompt), list(chosen), served.completion_token_ids))
    return pairs, unpaired


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
