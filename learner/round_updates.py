"""A round's updates in their fixed order (policy gradient, KTO, the verified sub-rounds, DPO),
the figures they report, and the stop check between them.

`learner.rounds` gathers the episodes, builds the trainer and publishes; this is what runs in
between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from learner.behaviour import BehaviourGap
from learner.config import RoundConfig
from learner.episodes import Episode
from learner.labels import Grounding, Label
from learner.round_data import NO_TOKEN_IDS
from learner.round_metrics import round_metrics
from learner.samples import PreferencePair, TrainingData, restated_pairs
from learner.store import even_chunks
from learner.subrounds import Replays, Sampling, SubroundResult, run_subrounds
from learner.train_step import PolicyTrainer


class RoundAborted(RuntimeError):
    """A stop was requested mid-round; nothing was committed, the episodes stay trainable."""


@dataclass(frozen=True)
class RoundInputs:
    """What a round trains on: its sorted episodes, the feedback's data, labels and replays."""

    episodes: list[Episode]
    data: TrainingData
    labels: dict[str, Label]
    replays: Replays


@dataclass(frozen=True)
class Learnt:
    """Each kind of update's metrics, and what the sub-rounds and restated labels gave."""

    pg: list[dict[str, float]]
    kto: list[dict[str, float]]
    dpo: list[dict[str, float]]
    sub: SubroundResult
    pairs: list[PreferencePair]
    restated: int

    @property
    def updates(self) -> bool:
        return bool(self.pg or self.kto or self.sub.updates or self.dpo)


def learn(
    trainer: PolicyTrainer,
    tokenizer: Any,
    inputs: RoundInputs,
    config: RoundConfig,
    *,
    sampling: Sampling,
    grounding: Mapping[str, Grounding],
    seed: int,
    current: int | None,
    stop: Callable[[], None],
    judge: Callable | None,
    say: Callable[[str], None],
) -> Learnt:
    """The round's updates in their fixed order: policy gradient on the feedback's samples,
    KTO on judged answers, the verified sub-rounds (sampling as the agents do, from `seed`),
    then DPO on every pair."""
    data = inputs.data
    pg = [
        trainer.step(c, current_version=current)
        for c in epochs(data.samples, config, stop, say, "policy-gradient")
    ]
    kto = [trainer.kto_step(c) for c in epochs(data.judged, config, stop, say, "KTO")]
    sub = run_subrounds(
        trainer,
        tokenizer,
        inputs.episodes,
        inputs.replays,
        config,
        sampling,
        seed=seed,
        current_version=current,
        check_stop=stop,
        judge=judge,
        say=say,
    )
    restated = restated_pairs(
        inputs.episodes,
        inputs.labels,
        grounding,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        encode=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        eos_id=tokenizer.eos_token_id,
        nll_weight=config.restated_nll,
    )
    pairs = data.pairs + sub.pairs + restated
    dpo = [trainer.dpo_step(c) for c in epochs(pairs, config, stop, say, "DPO")]
    return Learnt(pg, kto, dpo, sub, pairs, len(restated))


def update_metrics(
    learnt: Learnt, data: TrainingData, gap: BehaviourGap, blind: int
) -> dict[str, float]:
    """The updates' figures, what each reward source gave, and the runs let go for lack of
    token ids."""
    counts = {
        "skipped_steps": data.skipped_steps,
        "skipped_corrections": data.skipped_corrections,
        "replaced_answers": data.replaced_answers,
        "reward_sources/feedback": len(data.samples),
        "reward_sources/kto_judged": len(data.judged),
        "reward_sources/correction_pairs": len(data.pairs),
        "reward_sources/restated_pairs": learnt.restated,
    }
    sub = learnt.sub
    metrics = round_metrics(
        learnt.pg + sub.updates, learnt.dpo, learnt.kto, counts, sub.metrics, gap.metrics()
    )
    metrics[f"untrainable/{NO_TOKEN_IDS}"] = float(blind)
    return metrics


def stopper(should_stop: Callable[[], bool]) -> Callable[[], None]:
    """A check, called between updates, that raises `RoundAborted` once `should_stop()`."""

    def check() -> None:
        if should_stop():
            raise RoundAborted("stop requested: round abandoned before its checkpoint")

    return check


def epochs(
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
