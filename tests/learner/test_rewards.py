import pytest

from agents.events import FeedbackEvent, FeedbackKind
from learner.rewards import (
    EpisodeReward,
    batch_rewards,
    scored,
    user_scales,
)
from tests.learner.learner_events import feedback


@pytest.mark.parametrize(
    ("kind", "value", "score"),
    [
        ("thumbs", 1, 1.0),
        ("thumbs", -1, -1.0),
        ("rating", 1, -1.0),
        ("rating", 3, 0.0),
        ("rating", 4, 0.5),
        ("rating", 5, 1.0),
        ("outcome", 0, -1.0),
        ("outcome", 0.75, 0.5),
        ("verifier", 1, 1.0),
        ("correction", None, None),
    ],
)
def test_each_kind_is_worth_its_reward_decided_once_on_the_event(kind, value, score):
    """The reward is decided when the feedback arrives and recorded; an event written before
    the field was filled reads the same, and a reward the kind does not give is refused."""
    event = feedback("t", kind, value, text="42" if kind == "correction" else None)
    assert event.reward == score
    assert [x.score for x in scored([event])] == ([] if score is None else [score])
    data = event.model_dump(mode="json") | {"reward": None}  # as older producers wrote it
    assert FeedbackEvent.model_validate(data).reward == score
    if score is not None:
        with pytest.raises(ValueError, match="by its kind"):
            FeedbackEvent.model_validate(data | {"reward": -score if score else 0.5})
    assert FeedbackKind(kind) is event.kind


def test_only_a_senders_latest_word_counts_then_the_mean():
    fb = [
        feedback("t", "thumbs", 1, user="u1", created_at=1.0),
        feedback("t", "thumbs", -1, user="u1", created_at=2.0),  # u1 changed their mind
        feedback("t", "rating", 4, user="u2", created_at=1.5),
        feedback("t", "correction", None, text="42", user="u2", created_at=3.0),
    ]
    assert sorted(i.score for i in scored(fb)) == [-1.0, 0.5]
    [r] = batch_rewards([fb], [[0]], max_user_share=1.0, silence_reward=None)
    assert r == EpisodeReward(-0.25, {0: -0.25})  # (-1 + 0.5) / 2


@pytest.mark.parametrize(
    ("masses", "share", "scales"),
    [
        ({"a": 8, "b": 1, "c": 1}, 0.5, {"a": 0.25, "b": 1, "c": 1}),  # a: 8 -> 2 of 4
        ({"a": 6, "b": 3, "c": 1}, 0.4, {"a": 1 / 3, "b": 2 / 3, "c": 1}),  # 2, 2, 1 of 5
        ({"a": 4, "b": 1}, 0.2, {"a": 0.25, "b": 1}),  # 2 users cannot each hold 20%: equal
        ({u: 1 for u in "abcde"}, 0.2, {u: 1 for u in "abcde"}),  # already within the cap
        ({"a": 3, "z": 0}, 0.2, {"a": 1, "z": 1}),
    ],
)
def test_user_scales_water_fill_to_the_cap(masses, share, scales):
    assert user_scales(masses, share) == pytest.approx(scales)


def test_a_poisoner_is_capped_but_a_verifier_is_not():
    spam = [[feedback(f"t{i}", "thumbs", -1, user="mal")] for i in range(8)]
    honest = [[feedback("h1", "thumbs", 1, user="u1")], [feedback("h2", "thumbs", 1, user="u2")]]
    checker = [[feedback("v", "verifier", 0, user="ci", source="verifier")] for _ in range(20)]
    out = batch_rewards(
        spam + honest + checker, [[0]] * 30, max_user_share=0.5, silence_reward=None
    )
    assert [r.reward for r in out[:8]] == [-0.25] * 8  # mal's mass 8 -> 2 = half of 4
    assert [r.reward for r in out[8:10]] == [1.0, 1.0]
    assert {r.reward for r in out[10:]} == {-1.0}


def test_one_key_posing_as_many_users_is_capped_as_one_sender():
    """130 users of one API key, one thumbs-down each: under the per-user cap alone each is
    a small sender and the key owns 130 of 134 units of mass; capped per credential it holds
    half, like any one user."""
    sybil = [
        [feedback(f"s{i}", "thumbs", -1, user=f"fake{i}", credential="bot")] for i in range(130)
    ]
    honest = [
        [feedback(f"h{i}", "thumbs", 1, user=f"u{i}", credential=f"app{i}")] for i in range(4)
    ]
    capped = batch_rewards(sybil + honest, [[0]] * 134, max_user_share=0.5, silence_reward=None)
    mass = sum(-r.reward for r in capped[:130])
    assert mass == pytest.approx(4.0)  # half of the scaled total 8: no more than one sender
    assert [r.reward for r in capped[130:]] == [1.0] * 4
    no_key = [[f.model_copy(update={"credential": None}) for f in fb] for fb in sybil]
    uncapped = batch_rewards(no_key + honest, [[0]] * 134, max_user_share=0.5, silence_reward=None)
    assert sum(-r.reward for r in uncapped[:130]) == pytest.approx(130.0)  # the defect, shown


def test_per_turn_rewards_fall_back_to_the_whole_run():
    fb = [feedback("t", "thumbs", 1), feedback("t", "rating", 1, user="u2", turn=2)]
    [r] = batch_rewards([fb], [[0, 2]], 1.0, None)
    assert r == EpisodeReward(1.0, {0: 1.0, 2: -1.0})
    only_turn = [feedback("t", "rating", 5, turn=0)]
    [r] = batch_rewards([only_turn], [[0, 2]], 1.0, None)
    assert r == EpisodeReward(1.0, {0: 1.0})  # turn 2 has nothing to learn from


def test_silence_and_corrections_give_no_scalar_by_default():
    correction = [feedback("t", "correction", None, text="It is 42.")]
    assert batch_rewards([[]], [[0]], 1.0, None) == [EpisodeReward(None, {})]
    assert batch_rewards([[]], [[0]], 1.0, 0.0) == [EpisodeReward(0.0, {0: 0.0})]
    # a correction is feedback (no silence) but no scalar: it becomes a preference pair
    assert batch_rewards([correction], [[0]], 1.0, 0.0) == [EpisodeReward(None, {})]
