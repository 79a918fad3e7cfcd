"""One learning round: trainable episodes -> rewards -> samples and pairs -> update -> publish."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from learner.advantages import RunningBaseline
from learner.behaviour import BehaviourGap, relog_behaviour
from learner.config import RoundConfig, TrainConfig
from learner.crashpoints import crash_point
from learner.decision_heads import HEADS_KEY, decision_examples, kept_heads, refit_heads
from learner.episodes import SILENT, Episode, settle, silent_episodes, trainable_episodes
from learner.judge import fit_judge, write_source_scores
from learner.labels import Grounding, Label, find_labels
from learner.policy.heads import write_heads
from learner.policy.models import (
    CheckpointError,
    ModelNotFound,
    load_base,
    load_checkpoint,
    load_version,
)
from learner.policy.registry import (
    CHAMPION,
    PolicyRegistry,
    PolicyVersion,
    UnknownVersion,
    version_number,
)
from learner.policy.storage import fetch_checkpoint
from learner.publish import Published, publish_version
from learner.rewards import EpisodeReward, batch_rewards, keep_turns
from learner.round_metrics import node_metrics, peak_rss_mb, round_metrics
from learner.samples import (
    TrainingData,
    build_training_data,
    judged_only,
    reads_tool_output,
    restated_pairs,
)
from learner.store import Store, even_chunks
from learner.subrounds import Replays, Sampling, plan_replays, run_subrounds
from learner.train_step import PolicyTrainer

log = logging.getLogger(__name__)

UNTRAINABLE = "untrainable"  # no rewarded step with logged token ids, no usable correction
NO_TOKEN_IDS = "no_token_ids"
"""Untrainable: no model step of the run logged token ids (another provider answered it)."""
BASELINE_KEY = "running_baseline"


@dataclass(frozen=True)
class RoundPlan:
    """One round as the learner process runs it: its knobs, and where its version goes."""

    checkpoints_dir: Path
    model_cache: Path
    """Where base models are converted or built (`load_base`'s `cache_dir`), and where an
    `s3://` parent is fetched to (`learner.policy.storage.fetch_checkpoint`)."""
    upload_to: str | None = None
    """`s3://bucket/prefix`: each version's checkpoint is uploaded there before it is
    published (ARLOOP_CHECKPOINT_URI); None: the registry names the local folder."""
    train: TrainConfig = field(default_factory=TrainConfig)
    round: RoundConfig = field(default_factory=RoundConfig)
    actor: str = "learner"
    promote: bool = True  # False: publish READY and leave the aliases to the eval gate
    grounding: Mapping[str, Grounding] = field(default_factory=dict)
    """Per agent name, what its pack lets the learner label and replay (none: feedback only)."""
    sampling: Sampling = field(default_factory=Sampling)
    """How the agents sample (temperature, max tokens): sub-rounds resample alike."""
    make_trainer: Callable[..., PolicyTrainer] | None = None
    """How the round's trainer is built (None: `PolicyTrainer` here). Under `accelerate launch`
    rank 0's runner passes one that starts the round on every rank and broadcasts each batch."""


@dataclass(frozen=True)
class RoundResult:
    """One round, for the summary line and the tests."""

    version: str
    parent: str
    episodes: int
    samples: int
    pairs: int
    skipped_steps: int
    reward_mean: float
    metrics: dict[str, float]
    seconds: float
    published: Published
    let_go: dict[str, int] = field(default_factory=dict)


class RoundAborted(RuntimeError):
    """A stop was requested mid-round; nothing was committed, the episodes stay trainable."""


def run_round(
    store: Store,
    registry: PolicyRegistry,
    plan: RoundPlan,
    *,
    now: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] = lambda line: None,
) -> RoundResult | None:
    """Train on what is trainable now and publish a version; None when there is nothing.
    `say` gets a line at each phase and update (the learner's progress display)."""
    start = time.monotonic()
    now = time.time() if now is None else now
    config = plan.round
    window, silence = config.feedback_window_s, config.silence_reward
    modelled = config.reward_model_heads > 0
    scoring = modelled and silence is None  # silent runs wait for the reward model's score
    settle(store, now, window, silence, keep_silent=scoring)
    episodes = trainable_episodes(store, now, window, silence, config.max_episodes)
    silent = silent_episodes(store, now, window, silence, config.max_episodes) if scoring else []
    episodes, blind = _without_token_ids(store, episodes)
    silent, blind_silent = _without_token_ids(store, silent)
    if not episodes:
        _let_go(store, silent, SILENT)
        return None
    parent = registry.get(registry.resolve(CHAMPION))
    model, tokenizer, adapter_dir = load_parent(parent, plan)
    pad, seed = tokenizer.pad_token_id, plan.train.seed
    if modelled:
        say(f"round: fitting the reward model on up to {config.reward_model_heads} heads")
    judge = fit_judge(store, model, pad, config, seed) if modelled else None
    scored = judge.score_runs([e.trajectory for e in silent]) if judge and judge.used else {}
    _let_go(store, [e for e in silent if e.trajectory.event_id not in scored], SILENT)
    episodes += [e for e in silent if e.trajectory.event_id in scored]
    episodes = sorted(episodes, key=content_key)  # the same batches whatever the arrival order
    episodes, gap = _relog(episodes, registry, plan, pad)
    labels, replays = _replays(episodes, tokenizer, plan)
    rest = [n for n in range(len(episodes)) if n not in replays.episodes]
    rest_episodes = [episodes[n] for n in rest]
    data, rewards = _training_data(store, rest_episodes, tokenizer, config, plan.grounding, scored)
    decided = decision_examples(episodes, labels, plan.grounding)  # labels for the heads
    headed = {  # the runs behind them: trained into a head
        n
        for key, label in labels.items()
        if getattr(plan.grounding.get(key.split("\x1f", 1)[0]), "decision", None) is not None
        for n in label.episodes
    }
    used = {rest[n] for n in data.used} | replays.episodes | headed
    unusable = [i for n, e in enumerate(episodes) if n not in used for i in e.event_ids]
    if (
        not data.samples
        and not data.pairs
        and not data.judged
        and not replays.starts
        and not decided
    ):
        store.settle(unusable, UNTRAINABLE)
        return None
    optimizer_state = (
        _optimizer_state(parent, plan.model_cache) if plan.train.full_finetune else None
    )
    make = plan.make_trainer or _local_trainer
    trainer = make(
        parent=parent,
        model=model,
        pad_id=pad,
        train=plan.train,
        model_cache=plan.model_cache,
        adapter_dir=adapter_dir,
        optimizer_state=optimizer_state,
    )
    current = version_number(parent.version)
    stop = _stopper(should_stop)
    pg = [
        trainer.step(c, current_version=current)
        for c in _epochs(data.samples, config, stop, say, "policy-gradient")
    ]
    kto = [trainer.kto_step(c) for c in _epochs(data.judged, config, stop, say, "KTO")]
    sub = run_subrounds(
        trainer,
        tokenizer,
        episodes,
        replays,
        config,
        plan.sampling,
        seed=plan.train.seed * 7919 + (current or 0),
        current_version=current,
        check_stop=stop,
        judge=judge.verdicts(trainer) if judge and judge.report else None,
        say=say,
    )
    restated = restated_pairs(
        episodes,
        labels,
        plan.grounding,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        eos_id=tokenizer.eos_token_id,
        nll_weight=config.restated_nll,
    )
    pairs = data.pairs + sub.pairs + restated
    dpo = [trainer.dpo_step(c) for c in _epochs(pairs, config, stop, say, "DPO")]
    if not pg and not kto and not sub.updates and not dpo and not decided:  # nothing to learn
        store.settle([i for e in episodes for i in e.event_ids], UNTRAINABLE)
        return None
    counts = {
        "skipped_steps": data.skipped_steps,
        "skipped_corrections": data.skipped_corrections,
        "replaced_answers": data.replaced_answers,
        "reward_sources/feedback": len(data.samples),
        "reward_sources/kto_judged": len(data.judged),
        "reward_sources/correction_pairs": len(data.pairs),
        "reward_sources/restated_pairs": len(restated),
    }
    metrics = round_metrics(pg + sub.updates, dpo, kto, counts, sub.metrics, gap.metrics())
    metrics[f"untrainable/{NO_TOKEN_IDS}"] = float(blind + blind_silent)
    metrics.update(node_metrics(rest_episodes, rewards))
    if judge is not None:
        metrics.update(judge.metrics(len(scored)))
    kept = store.get_meta(HEADS_KEY, {})
    heads, head_metrics = refit_heads(parent, decided, kept, plan.grounding, plan.model_cache)
    metrics.update(head_metrics)
    metrics["memory/peak_rss_mb"] = peak_rss_mb()  # training, sub-rounds and reward model done
    crash_point("during_train")
    trained = [i for n in sorted(used) for i in episodes[n].event_ids]

    def save(directory: Path) -> None:
        trainer.save(directory)
        tokenizer.save_pretrained(directory)
        write_heads(directory, heads)
        if scored and sub.judged:  # its scores trained: the gate weighs its disagreement
            write_source_scores(directory, sub.judged)

    published = publish_version(
        store,
        registry,
        save,
        checkpoints_dir=plan.checkpoints_dir,
        parent=parent,
        kind="full" if plan.train.full_finetune else "lora",
        metrics=metrics,
        trained=trained,
        let_go={UNTRAINABLE: unusable},
        meta={BASELINE_KEY: vars(data.baseline)}
        | ({HEADS_KEY: kept_heads(heads)} if heads else {}),
        actor=plan.actor,
        promote=plan.promote,
        upload_to=plan.upload_to,
    )
    rewards = [s.reward for s in data.samples]
    return RoundResult(
        version=published.version,
        parent=parent.version,
        episodes=len(used),
        samples=len(data.samples) + sub.samples,
        pairs=len(pairs),
        skipped_steps=data.skipped_steps,
        reward_mean=sum(rewards) / len(rewards) if rewards else math.nan,
        metrics=metrics,
        seconds=time.monotonic() - start,
        published=published,
        let_go={UNTRAINABLE: len(episodes) - len(used)} if len(used) < len(episodes) else {},
    )


def content_key(episode: Episode) -> str:
    """A digest of what an episode trains on, to order a round's episodes by.

    Which episodes a round takes is "oldest first"; the order they are batched in is this
    key, so the updates (and the float sums inside them) do not depend on which run happened
    to finish or arrive first. Episodes with equal keys are interchangeable.
    """
    t = episode.trajectory
    steps = [(s.prompt_token_ids, s.completion_token_ids) for s in t.model_steps]
    said = [(f.kind, f.value, f.text, f.turn, f.user_id) for f in episode.feedback]
    return hashlib.sha256(json.dumps([steps, t.output, said]).encode()).hexdigest()


def load_parent(parent: PolicyVersion, plan: RoundPlan) -> tuple[torch.nn.Module, Any, Path | None]:
    """(model, tokenizer, adapter folder to continue) for the version a round starts from."""
    if parent.checkpoint_kind == "full":
        model, tokenizer = load_checkpoint(
            fetch_checkpoint(parent, plan.model_cache),
            base_model=parent.base_model,
            cache_dir=plan.model_cache,
        )
        return model, tokenizer, None
    model, tokenizer = load_base(parent.base_model, cache_dir=plan.model_cache)
    if parent.checkpoint_kind == "base":
        return model, tokenizer, None
    if plan.train.full_finetune:
        raise ValueError(
            f"champion {parent.version} is a LoRA adapter but full fine-tuning is on: set "
            "ARLOOP_TRAIN__FULL_FINETUNE=false, or promote a full checkpoint (or v0) to champion "
            "first"
        )
    return model, tokenizer, fetch_checkpoint(parent, plan.model_cache)


def _relog(
    episodes: list[Episode], registry: PolicyRegistry, plan: RoundPlan, pad_id: int
) -> tuple[list[Episode], BehaviourGap]:
    """The episodes with behaviour logprobs in the learner's numerics (`learner.behaviour`)."""
    if not plan.round.recompute_behaviour:
        return episodes, BehaviourGap()

    def trained(episode: Episode, step) -> bool:
        return plan.round.train_after_tool or step.index in credited_turns(episode)

    def load(version: str) -> torch.nn.Module | None:
        try:
            return load_version(registry.get(version), cache_dir=plan.model_cache)[0]
        except (UnknownVersion, CheckpointError, ModelNotFound) as exc:
            log.warning("behaviour logprobs of %s kept as logged: %s", version, exc)
            return None

    return relog_behaviour(episodes, trained, load, pad_id, plan.round.batch_size)


def _local_trainer(
    *,
    parent: PolicyVersion,
    model: torch.nn.Module,
    pad_id: int,
    train: TrainConfig,
    model_cache: Path,
    adapter_dir: Path | None,
    optimizer_state: Path | None,
) -> PolicyTrainer:
    """The trainer of a one-process learner (`RoundPlan.make_trainer`'s default)."""
    return PolicyTrainer(
        model, pad_id, train, adapter_dir=adapter_dir, optimizer_state=optimizer_state
    )


def _optimizer_state(parent: PolicyVersion, model_cache: Path) -> Path | None:
    """A full checkpoint's AdamW moments (a LoRA adapter's come with `adapter_dir`)."""
    if parent.checkpoint_kind != "full":
        return None
    return fetch_checkpoint(parent, model_cache) / "optimizer.pt"


def _replays(
    episodes: Sequence[Episode], tokenizer: Any, plan: RoundPlan
) -> tuple[dict[str, Label], Replays]:
    """The round's labels and the labelled prompts it replays (none without groundings or
    sub-rounds)."""
    config = plan.round
    if not plan.grounding or config.subrounds == 0:
        return {}, Replays([], [], 0, math.nan)
    labels = find_labels(
        episodes,
        plan.grounding,
        noise=config.label_noise,
        threshold=config.label_threshold,
        max_user_share=config.max_user_reward_share,
    )
    return labels, plan_replays(episodes, labels, plan.grounding, config, tokenizer)


def _training_data(
    store: Store,
    episodes: Sequence[Episode],
    tokenizer: Any,
    config: RoundConfig,
    grounding: Mapping[str, Grounding],
    scored: Mapping[str, float],
) -> tuple[TrainingData, list[EpisodeReward]]:
    """Samples, pairs and judged answers from the episodes' feedback, and the rewards they
    came from; a silent run the reward model scored (`scored`, by trajectory id) gets that
    score on every turn."""
    rewards = batch_rewards(
        [e.feedback for e in episodes],
        [[s.index for s in e.trajectory.model_steps] for e in episodes],
        config.max_user_reward_share,
        config.silence_reward,
    )
    rewards = [
        model_reward(e, scored[e.trajectory.event_id]) if e.trajectory.event_id in scored else r
        for r, e in zip(rewards, episodes, strict=True)
    ]
    if not config.train_after_tool:
        rewards = [keep_turns(r, credited_turns(e)) for r, e in zip(rewards, episodes, strict=True)]
    data = build_training_data(
        episodes,
        rewards,
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        eos_id=tokenizer.eos_token_id,
        baseline=config.baseline,
        state=RunningBaseline(**store.get_meta(BASELINE_KEY, {})),
        normalise_rewards=config.normalise_rewards,
        # with a grounding, a correction is a label: a pair only beside a verified run
        text_pairs=lambda e: e.trajectory.agent not in grounding or config.subrounds == 0,
        judged_only=judged_only if config.kto_judgements else lambda episode: False,
    )
    return data, rewards


def model_reward(episode: Episode, score: float) -> EpisodeReward:
    """A silent run's reward from the reward model's pessimistic score, on every model turn."""
    return EpisodeReward(score, {s.index: score for s in episode.trajectory.model_steps})


def _without_token_ids(store: Store, episodes: list[Episode]) -> tuple[list[Episode], int]:
    """(the episodes a model step of which logged token ids, how many had none): runs another
    provider answered cannot train; they are let go as `no_token_ids`, a count in the store
    and the round's metrics, not an error."""
    blind = [
        e
        for e in episodes
        if e.trajectory.model_steps
        and not any(s.prompt_token_ids and s.completion_token_ids for s in e.trajectory.model_steps)
    ]
    if not blind:
        return episodes, 0
    _let_go(store, blind, NO_TOKEN_IDS)
    log.info("%d runs without token ids let go (another provider answered them)", len(blind))
    gone = {e.trajectory.event_id for e in blind}
    return [e for e in episodes if e.trajectory.event_id not in gone], len(blind)


def _let_go(store: Store, episodes: Sequence[Episode], reason: str) -> None:
    if episodes:
        store.settle([i for e in episodes for i in e.event_ids], reason)


def credited_turns(episode: Episode) -> set[int]:
    """Model turns before the run's first tool output, and any turn feedback names.

    A turn written after a tool's output mostly reads it back (the tutor's `#### 42` after the
    calculator said 42); whole-run feedback on it judges the call before it, and training it
    with that reward adds noise and dilutes the call's tokens in the update.
    """
    named = {f.turn for f in episode.feedback if f.turn is not None}
    t = episode.trajectory
    return {s.index for s in t.model_steps if not reads_tool_output(t, s) or s.index in named}


def _stopper(should_stop: Callable[[], bool]) -> Callable[[], None]:
    def check() -> None:
        if should_stop():
            raise RoundAborted("stop requested: round abandoned before its checkpoint")

    return check


def _epochs(
    items: list,
    config: RoundConfig,
    stop: Callable[[], None],
    say: Callable[[str], None] = lambda line: None,
    what: str = "",
):
    """`epochs` passes over `items` in equal-size steps of about `batch_size` each."""
    chunks = even_chunks(items, config.batch_size)
    total = config.epochs * len(chunks)
    for epoch in range(config.epochs):
        for n, chunk in enumerate(chunks, 1):
            stop()
            say(f"round: {what} update {epoch * len(chunks) + n}/{total} ({len(chunk)} samples)")
            yield chunk
