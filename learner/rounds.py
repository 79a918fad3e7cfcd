"""One learning round: trainable episodes -> rewards -> samples and pairs -> update -> publish.

What the round reads from the episodes before touching a model (which runs can train, their
order, credited turns, the feedback's samples) is `learner.round_data`."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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
from learner.round_data import (
    BASELINE_KEY,
    UNTRAINABLE,
    content_key,
    credited_turns,
    let_go,
    training_data,
    without_token_ids,
)
from learner.round_metrics import node_metrics, peak_rss_mb
from learner.round_updates import RoundInputs, learn, stopper, update_metrics
from learner.store import Store
from learner.subrounds import Replays, Sampling, plan_replays
from learner.train_step import PolicyTrainer

log = logging.getLogger(__name__)


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
    config = plan.round
    found = _gather(store, time.time() if now is None else now, config)
    if found is None:
        return None
    episodes, silent, blind = found
    parent = registry.get(registry.resolve(CHAMPION))
    model, tokenizer, adapter_dir = load_parent(parent, plan)
    pad, seed = tokenizer.pad_token_id, plan.train.seed
    if config.reward_model_heads > 0:
        say(f"round: fitting the reward model on up to {config.reward_model_heads} heads")
        judge = fit_judge(store, model, pad, config, seed)
    else:
        judge = None
    scored = judge.score_runs([e.trajectory for e in silent]) if judge and judge.used else {}
    let_go(store, [e for e in silent if e.trajectory.event_id not in scored], SILENT)
    episodes += [e for e in silent if e.trajectory.event_id in scored]
    episodes = sorted(episodes, key=content_key)  # the same batches whatever the arrival order
    episodes, gap = _relog(episodes, registry, plan, pad)
    labels, replays = _replays(episodes, tokenizer, plan)
    rest = [n for n in range(len(episodes)) if n not in replays.episodes]
    rest_episodes = [episodes[n] for n in rest]
    data, rewards = training_data(store, rest_episodes, tokenizer, config, plan.grounding, scored)
    decided = decision_examples(episodes, labels, plan.grounding)  # labels for the heads
    headed = {  # the runs behind them: trained into a head
        n
        for key, label in labels.items()
        if getattr(plan.grounding.get(key.split("\x1f", 1)[0]), "decision", None) is not None
        for n in label.episodes
    }
    used = {rest[n] for n in data.used} | replays.episodes | headed
    unusable = [i for n, e in enumerate(episodes) if n not in used for i in e.event_ids]
    if not (data.samples or data.pairs or data.judged or replays.starts or decided):
        store.settle(unusable, UNTRAINABLE)
        return None
    trainer = (plan.make_trainer or _local_trainer)(
        parent=parent,
        model=model,
        pad_id=pad,
        train=plan.train,
        model_cache=plan.model_cache,
        adapter_dir=adapter_dir,
        optimizer_state=_optimizer_state(parent, plan.model_cache)
        if plan.train.full_finetune
        else None,
    )
    current = version_number(parent.version)
    learnt = learn(
        trainer,
        tokenizer,
        RoundInputs(episodes, data, labels, replays),
        config,
        sampling=plan.sampling,
        grounding=plan.grounding,
        seed=seed * 7919 + (current or 0),
        current=current,
        stop=stopper(should_stop),
        judge=judge.verdicts(trainer) if judge and judge.report else None,
        say=say,
    )
    if not learnt.updates and not decided:  # nothing to learn
        store.settle([i for e in episodes for i in e.event_ids], UNTRAINABLE)
        return None
    metrics = update_metrics(learnt, data, gap, blind)
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
        if scored and learnt.sub.judged:  # its scores trained: the gate weighs its disagreement
            write_source_scores(directory, learnt.sub.judged)

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
    sampled = [s.reward for s in data.samples]
    return RoundResult(
        version=published.version,
        parent=parent.version,
        episodes=len(used),
        samples=len(data.samples) + learnt.sub.samples,
        pairs=len(learnt.pairs),
        skipped_steps=data.skipped_steps,
        reward_mean=sum(sampled) / len(sampled) if sampled else math.nan,
        metrics=metrics,
        seconds=time.monotonic() - start,
        published=published,
        let_go={UNTRAINABLE: len(episodes) - len(used)} if len(used) < len(episodes) else {},
    )


def _gather(
    store: Store, now: float, config: RoundConfig
) -> tuple[list[Episode], list[Episode], int] | None:
    """(trainable episodes, silent ones for the reward model to score, how many runs had no
    token ids) after settling what the feedback window closed; None when nothing can train
    (the silent runs are let go)."""
    window, silence = config.feedback_window_s, config.silence_reward
    scoring = config.reward_model_heads > 0 and silence is None  # silent runs wait for a score
    settle(store, now, window, silence, keep_silent=scoring)
    episodes = trainable_episodes(store, now, window, silence, config.max_episodes)
    silent = silent_episodes(store, now, window, silence, config.max_episodes) if scoring else []
    episodes, blind = without_token_ids(store, episodes)
    silent, blind_silent = without_token_ids(store, silent)
    if not episodes:
        let_go(store, silent, SILENT)
        return None
    return episodes, silent, blind + blind_silent


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
