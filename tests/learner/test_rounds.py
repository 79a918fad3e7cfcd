"""Learner-side end to end: events in Redis as the agent API writes them -> a round -> a version."""

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from learner.episodes import SILENT
from learner.logprobs import completion_logprobs
from learner.policy.models import checkpoint_path, load_base, load_version
from learner.policy.registry import CHAMPION, VersionStatus
from learner.reward_model import heldout
from learner.round_data import NO_TOKEN_IDS
from learner.round_metrics import peak_rss_mb
from learner.round_updates import RoundAborted
from learner.rounds import run_round
from learner.train_step import TrainConfig
from learner.trajectory_source import TrajectorySource
from tests.learner.learner_events import (
    completion_ids,
    feedback,
    prompt_ids,
    trajectory,
    xadd,
)
from tests.learner.learner_fixtures import base_registry, open_store, tiny_round_plan
from tests.model_cache import MODEL_CACHE

PROMPT = "What is 12 plus 30?"
GOOD, BAD = "The answer is 42.", "sorry no"


def _ingest(redis_client, store, events) -> None:
    for e in events:
        xadd(redis_client, e)
    source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
    source.ensure_groups()
    while not source.poll().caught_up:
        pass


def _logged_runs(n=6):
    """n runs of one prompt (a GRPO group): good answers thumbed up, bad ones down, by n users."""
    events = []
    for i in range(n):
        good = i % 2 == 0
        t = trajectory(PROMPT, GOOD if good else BAD, user=f"u{i}", logprobs=True)
        events += [t, feedback(t.event_id, "thumbs", 1 if good else -1, user=f"u{i}")]
    return events


def _mean_logprob(model, answer: str, prompt: str = PROMPT) -> float:
    return float(completion_logprobs(model, prompt_ids(prompt), completion_ids(answer), 0).mean())


def test_a_round_publishes_a_loadable_version_that_moved_the_right_way(
    redis_client, store, registry, tmp_path
):
    events = _logged_runs()
    _ingest(redis_client, store, events)
    result = run_round(store, registry, tiny_round_plan(tmp_path))
    assert (result.version, result.parent, result.episodes, result.samples) == ("v1", "v0", 6, 6)
    assert result.published.champion and registry.resolve(CHAMPION) == "v1"
    record = registry.get("v1")
    assert (record.parent, record.checkpoint_kind, record.base_model) == ("v0", "lora", "tiny")
    assert record.status is VersionStatus.CHAMPION
    assert registry.get("v0").status is VersionStatus.RETIRED
    assert 0 < record.metrics["memory/peak_rss_mb"] <= peak_rss_mb()  # the learner's, at the time
    manifest = json.loads((checkpoint_path(record.checkpoint_uri) / "manifest.json").read_text())
    assert sorted(manifest["trained_event_ids"]) == sorted(e.event_id for e in events)
    assert store.ledger() == {e.event_id: "v1" for e in events}
    trained, _ = load_version(record, cache_dir=MODEL_CACHE)  # as the policy server loads it
    base, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    assert _mean_logprob(trained, GOOD) > _mean_logprob(base, GOOD)
    assert _mean_logprob(trained, BAD) < _mean_logprob(base, BAD)
    assert run_round(store, registry, tiny_round_plan(tmp_path)) is None  # nothing left


def test_the_next_round_continues_the_champions_adapter(redis_client, store, registry, tmp_path):
    _ingest(redis_client, store, _logged_runs(4))
    run_round(store, registry, tiny_round_plan(tmp_path))
    _ingest(redis_client, store, _logged_runs(4))
    no_step = TrainConfig(learning_rate=0.0, lora_rank=8, lora_alpha=16, kl_coef=0.0)
    frozen = tiny_round_plan(tmp_path, train=no_step)  # cannot move the weights: v2 == its start
    result = run_round(store, registry, frozen)
    assert (result.version, result.parent) == ("v2", "v1")
    v1, v2 = (
        load_file(tmp_path / "checkpoints" / v / "adapter_model.safetensors") for v in ("v1", "v2")
    )
    assert v1.keys() == v2.keys()
    assert all(torch.equal(v1[k], v2[k]) for k in v1)
    assert any(v1[k].abs().sum() > 0 for k in v1 if "lora_B" in k)  # v1 is not a fresh adapter


def test_corrections_train_by_dpo_and_steps_without_ids_are_let_go(
    redis_client, store, registry, tmp_path
):
    fixed = trajectory(PROMPT, "The answer is 41.", logprobs=True)
    blind = trajectory(PROMPT, GOOD, with_ids=False)
    events = [
        fixed,
        feedback(fixed.event_id, "correction", None, text=GOOD),
        blind,
        feedback(blind.event_id, "thumbs", 1),
    ]
    _ingest(redis_client, store, events)
    result = run_round(store, registry, tiny_round_plan(tmp_path))
    assert (result.samples, result.pairs, result.skipped_steps) == (0, 1, 0)
    assert "dpo/loss" in result.metrics
    assert result.metrics["untrainable/no_token_ids"] == 1.0  # another provider's run: a reason
    assert set(store.ledger()) == {e.event_id for e in events[:2]}
    counts = store.counts()
    assert counts["trajectories/" + NO_TOKEN_IDS] == counts["feedback/" + NO_TOKEN_IDS] == 1


def test_runs_without_any_token_ids_are_let_go_as_such_before_loading_a_model(
    redis_client, store, registry, tmp_path
):
    blind = [trajectory(PROMPT, GOOD, user=f"u{i}", with_ids=False) for i in range(3)]
    _ingest(redis_client, store, [*blind, *(feedback(t.event_id, "thumbs", 1) for t in blind)])
    assert run_round(store, registry, tiny_round_plan(tmp_path)) is None  # no crash, no version
    counts = store.counts()
    assert counts["trajectories/" + NO_TOKEN_IDS] == counts["feedback/" + NO_TOKEN_IDS] == 3
    assert not store.ledger() and registry.resolve(CHAMPION) == "v0"


def test_a_stop_mid_round_commits_nothing(redis_client, store, registry, tmp_path):
    _ingest(redis_client, store, _logged_runs(2))
    with pytest.raises(RoundAborted):
        run_round(store, registry, tiny_round_plan(tmp_path), should_stop=lambda: True)
    assert store.ledger() == {} and registry.resolve(CHAMPION) == "v0"
    assert run_round(store, registry, tiny_round_plan(tmp_path)).version == "v1"


def test_full_finetuning_publishes_full_weights_and_continues_from_them(
    redis_client, store, registry, tmp_path
):
    full = tiny_round_plan(
        tmp_path, train=TrainConfig(learning_rate=1e-2, full_finetune=True, kl_coef=0.0)
    )
    _ingest(redis_client, store, _logged_runs(2))
    assert run_round(store, registry, full).version == "v1"
    record = registry.get("v1")
    folder = checkpoint_path(record.checkpoint_uri)
    assert record.checkpoint_kind == "full" and (folder / "model.safetensors").is_file()
    trained, _ = load_version(record, cache_dir=MODEL_CACHE)
    base, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    assert _mean_logprob(trained, GOOD) != _mean_logprob(base, GOOD)
    _ingest(redis_client, store, _logged_runs(2))
    assert (run_round(store, registry, full).parent, registry.resolve(CHAMPION)) == ("v1", "v2")


@pytest.mark.parametrize("after_tool, trained", [(True, 2), (False, 1)])
def test_turns_after_a_tool_output_train_only_when_asked(
    redis_client, store, registry, tmp_path, after_tool, trained
):
    runs = [
        trajectory(PROMPT, GOOD if i % 2 else BAD, user=f"u{i}", tool_turn=True) for i in range(2)
    ]
    events = [
        e
        for i, t in enumerate(runs)
        for e in (t, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))
    ]
    _ingest(redis_client, store, events)
    result = run_round(store, registry, tiny_round_plan(tmp_path, train_after_tool=after_tool))
    assert result.samples == 2 * trained  # the call turn always; the answer turn only when asked


def test_feedback_naming_a_turn_after_a_tool_still_trains_it(
    redis_client, store, registry, tmp_path
):
    t = trajectory(PROMPT, BAD, tool_turn=True)
    _ingest(
        redis_client,
        store,
        [t, feedback(t.event_id, "thumbs", -1, turn=2), feedback(t.event_id, "thumbs", 1)],
    )
    plan = tiny_round_plan(tmp_path, train_after_tool=False, kto_judgements=False)
    result = run_round(store, registry, plan)  # a lone judged run: policy gradient when asked
    assert result.samples == 2


def test_a_round_trains_the_same_whatever_order_its_runs_finished_in(redis_client, tmp_path):
    """Batches follow a content key, not arrival: permuted finish times, bit-identical adapter."""
    runs = [
        (trajectory(PROMPT, GOOD if i % 3 else BAD, user=f"u{i}", logprobs=True), i % 3 != 0)
        for i in range(12)
    ]
    adapters = []
    for name, order in (("a", range(12)), ("b", reversed(range(12)))):
        redis_client.flushall()
        registry = base_registry(redis_client)
        events = []
        for rank, i in enumerate(order):
            t, good = runs[i]
            t = t.model_copy(update={"finished_at": 1000.0 + rank})
            events += [t, feedback(t.event_id, "thumbs", 1 if good else -1, user=f"u{i}")]
        store = open_store(tmp_path / name)
        _ingest(redis_client, store, events)
        config = tiny_round_plan(tmp_path / name, batch_size=4)  # 3 updates: order matters
        result = run_round(store, registry, config, now=10_000.0)
        store.close()
        assert result.samples == 12
        folder = tmp_path / name / "checkpoints" / result.version
        adapters.append(load_file(folder / "adapter_model.safetensors"))
    a, b = adapters
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _judged_and_silent(judged=24, silent=4):
    """Runs of many prompts: good answers thumbed up, bad ones down; and runs nobody judged.
    Their ids are fixed: which runs the reward model holds out follows from them."""
    events, quiet = [], []
    for i in range(judged):
        good = i % 2 == 0
        t = trajectory(f"What is {i} plus 30?", GOOD if good else BAD, user=f"u{i}", logprobs=True)
        t = t.model_copy(update={"event_id": f"traj_judged_{i:03d}"})
        events += [t, feedback(t.event_id, "thumbs", 1 if good else -1, user=f"u{i}")]
    for i in range(silent):
        quiet.append(trajectory(f"What is {100 + i} plus 1?", GOOD if i % 2 == 0 else BAD))
    return events, quiet


def test_silent_runs_train_on_the_reward_models_score_once_it_ranks_held_out_runs(
    redis_client, store, registry, tmp_path
):
    events, quiet = _judged_and_silent()
    held = [e for e in events[::2] if heldout(e.event_id)]
    assert {e.output for e in held} == {GOOD, BAD}  # the precondition: both kinds held out
    _ingest(redis_client, store, events + quiet)
    plan = tiny_round_plan(tmp_path, reward_model_min_runs=16, kto_judgements=False)
    result = run_round(store, registry, plan, now=time.time() + 601)  # every window closed
    m = result.metrics
    assert m["reward_model/used"] == 1.0, m  # the precondition: good and bad answers separate
    assert m["reward_model/auroc"] >= 0.9
    assert m["reward_sources/reward_model"] == len(quiet)
    assert {t.event_id for t in quiet} <= set(store.ledger())  # trained on, in the ledger
    assert result.samples == len(events) // 2 + len(quiet)


def test_without_a_usable_reward_model_silent_runs_are_let_go_as_before(
    redis_client, store, registry, tmp_path
):
    events, quiet = _judged_and_silent(judged=6)
    _ingest(redis_client, store, events + quiet)
    plan = tiny_round_plan(tmp_path, reward_model_min_runs=16)
    result = run_round(store, registry, plan, now=time.time() + 601)
    assert "reward_model/auroc" not in result.metrics  # 6 judged runs: no fit
    assert result.metrics["reward_model/used"] == 0.0
    assert not {t.event_id for t in quiet} & set(store.ledger())
    assert store.counts()["trajectories/" + SILENT] == len(quiet)


def test_lone_answers_judged_only_by_thumbs_and_ratings_train_by_kto(
    redis_client, store, registry, tmp_path
):
    runs = [(f"What is {i} plus 30?", GOOD if i % 2 == 0 else BAD) for i in range(6)]
    events = []
    for i, (prompt, answer) in enumerate(runs):  # each prompt once: no group to compare with
        t = trajectory(prompt, answer, user=f"u{i}", logprobs=True)
        judgement = (
            ("thumbs", 1 if answer == GOOD else -1)
            if i < 4
            else ("rating", 5 if answer == GOOD else 1)
        )
        events += [t, feedback(t.event_id, *judgement, user=f"u{i}")]
    _ingest(redis_client, store, events)
    result = run_round(store, registry, tiny_round_plan(tmp_path, kto_judgements=True))
    m = result.metrics
    assert (result.samples, m["reward_sources/kto_judged"]) == (0, 6)
    assert (m["kto/count/desirable"], m["kto/count/undesirable"]) == (3, 3)
    assert set(store.ledger()) == {e.event_id for e in events}
    trained, _ = load_version(registry.get(result.version), cache_dir=MODEL_CACHE)
    base, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    for prompt, answer in runs:
        moved = _mean_logprob(trained, answer, prompt) - _mean_logprob(base, answer, prompt)
        assert moved > 0 if answer == GOOD else moved < 0, (prompt, answer, moved)


def test_a_group_of_judged_answers_still_trains_group_relative(
    redis_client, store, registry, tmp_path
):
    _ingest(redis_client, store, _logged_runs())  # one prompt, six runs: a GRPO group
    result = run_round(store, registry, tiny_round_plan(tmp_path, kto_judgements=True))
    assert (result.samples, result.metrics["reward_sources/kto_judged"]) == (6, 0)


def test_labels_fit_the_decision_head_each_version_carries_on_all_labels_so_far(
    redis_client, store, registry, tmp_path
):
    """A correction naming a level labels its prompt; the round fits the `level` head on it and
    the next round refits on the parent's examples and its own."""
    from dataclasses import replace

    from agents.decisions import Decision
    from learner.labels import Grounding
    from learner.policy.heads import read_heads
    from tools.verifiers import LEVELS, mentioned_level, triage_level, with_level

    said = "Rest and drink water.\nTriage: self-care"
    decision = Decision("level", LEVELS, apply=with_level)
    grounding = {"tutor": Grounding(triage_level, mentioned_level, decision=decision)}
    plan = replace(tiny_round_plan(tmp_path), grounding=grounding)

    def labelled(prompt: str, level: str, n: int = 2) -> list:
        events = []
        for i in range(n):
            t = trajectory(prompt, said, user=f"{level}{i}", logprobs=True)
            events += [
                t,
                feedback(t.event_id, "correction", None, text=f"this was {level}", user=f"c{i}"),
            ]
        return events

    _ingest(redis_client, store, labelled("my chest hurts badly", "emergency"))
    _ingest(redis_client, store, labelled("a small cut on my thumb", "self-care"))
    first = run_round(store, registry, plan)
    heads = read_heads(checkpoint_path(registry.get(first.version).checkpoint_uri))
    assert first.metrics["decision/level/new_labels"] == 2.0
    assert heads["level"].fitted and heads["level"].labels == list(LEVELS)
    assert sorted(e["label"] for e in heads["level"].examples) == ["emergency", "self-care"]
    assert all("chest" not in e["prompt"] for e in heads["level"].examples)  # a digest only

    _ingest(redis_client, store, labelled("my ear aches since this morning", "see a doctor"))
    second = run_round(store, registry, plan)
    assert second.parent == first.version
    again = read_heads(checkpoint_path(registry.get(second.version).checkpoint_uri))["level"]
    assert sorted(e["label"] for e in again.examples) == ["emergency", "see a doctor", "self-care"]
    assert second.metrics["decision/level/examples"] == 3.0
    assert second.metrics["decision/level/train_accuracy"] == 1.0


def test_a_head_keeps_the_labels_of_a_version_that_was_not_released(
    redis_client, store, registry, tmp_path
):
    """Round 2 starts from v0 (v1 waits for the gate, or was rejected), yet its head holds
    round 1's labels too: the examples are the learner's, kept with its ledger."""
    from dataclasses import replace

    from agents.decisions import Decision
    from learner.labels import Grounding
    from learner.policy.heads import read_heads
    from tools.verifiers import LEVELS, mentioned_level, triage_level, with_level

    said = "Rest and drink water.\nTriage: self-care"
    grounding = {
        "tutor": Grounding(
            triage_level, mentioned_level, decision=Decision("level", LEVELS, with_level)
        )
    }
    plan = replace(tiny_round_plan(tmp_path), grounding=grounding, promote=False)

    def labelled(prompt: str, level: str) -> list:
        t = trajectory(prompt, said, user=f"p-{level}", logprobs=True)
        return [
            t,
            feedback(t.event_id, "correction", None, text=f"this was {level}", user="clinic"),
        ]

    _ingest(redis_client, store, labelled("my chest hurts badly", "emergency"))
    first = run_round(store, registry, plan)
    assert registry.resolve(CHAMPION) == "v0" and first.parent == "v0"
    _ingest(redis_client, store, labelled("a small cut on my thumb", "self-care"))
    second = run_round(store, registry, plan)

    assert second.parent == "v0"
    head = read_heads(checkpoint_path(registry.get(second.version).checkpoint_uri))["level"]
    assert sorted(e["label"] for e in head.examples) == ["emergency", "self-care"]
    assert head.fitted


def test_a_reviewers_verdict_becomes_a_label_a_round_fits_into_the_head(
    redis_client, store, registry, tmp_path
):
    """The annotation queue's verdict (kind `review`: a score of what was returned and the
    right level in its text) labels the prompt, and the round's head learns it."""
    from dataclasses import replace

    from agents.decisions import Decision
    from learner.labels import Grounding
    from learner.policy.heads import read_heads
    from tools.verifiers import LEVELS, mentioned_level, triage_level, with_level

    said = "Rest and drink water.\nTriage: self-care"
    grounding = {
        "tutor": Grounding(
            triage_level, mentioned_level, decision=Decision("level", LEVELS, with_level)
        )
    }
    plan = replace(tiny_round_plan(tmp_path), grounding=grounding)
    events = []
    for prompt, level in (
        ("my chest hurts badly", "emergency"),
        ("a small cut on my thumb", "self-care"),
    ):
        t = trajectory(prompt, said, user="patient", logprobs=True)
        score = 1.0 if level == "self-care" else 0.0
        events += [
            t,
            feedback(
                t.event_id, "review", score, text=f"Triage: {level}", user="nurse", source="review"
            ),
        ]
    _ingest(redis_client, store, events)
    result = run_round(store, registry, plan)

    assert result.metrics["decision/level/new_labels"] == 2.0
    head = read_heads(checkpoint_path(registry.get(result.version).checkpoint_uri))["level"]
    assert sorted(e["label"] for e in head.examples) == ["emergency", "self-care"]
