"""Labels from feedback: which answer a prompt should get, and how sure its feedback makes us."""

from __future__ import annotations

import math

import pytest

from agents.decisions import Decision
from agents.events import CASE_KEY, AnswerPath
from learner.decision_heads import decision_examples
from learner.episodes import Episode
from learner.labels import Grounding, episode_votes, find_labels, prompt_key
from tests.learner.learner_events import feedback, trajectory
from tools.verifiers import (
    LEVELS,
    final_number,
    mentioned_level,
    mentioned_number,
    triage_level,
    with_level,
)

TUTOR = {"tutor": Grounding(final_number, mentioned_number)}
QUESTION = "What is 12 plus 30?"


def _run(answer: str, *said, user: str = "u1", prompt: str = QUESTION) -> Episode:
    t = trajectory(prompt, answer, user=user)
    return Episode(t, tuple(feedback(t.event_id, *s[:2], user=s[2], text=s[3]) for s in said))


def up(user: str = "u1"):
    return ("thumbs", 1, user, None)


def down(user: str = "u1"):
    return ("thumbs", -1, user, None)


def rating(value: int, user: str = "u1"):
    return ("rating", value, user, None)


def correction(text: str, user: str = "u1"):
    return ("correction", None, user, text)


def test_one_thumbs_up_labels_the_answer_with_the_posterior_under_the_noise():
    [label] = find_labels([_run("#### 42", up())], TUTOR, noise=0.05).values()
    assert (label.answer, label.episodes, label.senders) == ("42", (0,), ("u1",))
    assert label.confidence == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("said", "weight"),
    [
        (up(), math.log(19)),
        (down(), -math.log(19)),
        (rating(5), math.log(19)),
        (rating(4), 0.5 * math.log(19)),  # a 4-star rating says half what a thumbs-up says
        (rating(3), None),  # neutral: no vote
        (("outcome", 1.0, "u1", None), math.log(19)),
        (("outcome", 0.0, "u1", None), -math.log(19)),
    ],
)
def test_each_judgement_kind_votes_on_the_served_answer(said, weight):
    votes = episode_votes(_run("#### 42", said), TUTOR["tutor"], noise=0.05)
    if weight is None:
        assert votes == []
    else:
        [vote] = votes
        assert (vote.answer, vote.weight) == ("42", pytest.approx(weight))


def test_a_correction_votes_for_the_answer_its_text_states():
    [vote] = episode_votes(_run("#### 40", correction("no, it's 42")), TUTOR["tutor"], 0.05)
    assert (vote.answer, vote.kind) == ("42", "correction")
    assert episode_votes(_run("#### 40", correction("wrong!")), TUTOR["tutor"], 0.05) == []


def test_a_reply_with_no_readable_answer_gets_no_vote_from_a_judgement():
    assert episode_votes(_run("I am not sure", up()), TUTOR["tutor"], 0.05) == []


def test_only_a_senders_latest_word_counts():
    t = trajectory(QUESTION, "#### 42")
    first = feedback(t.event_id, "thumbs", 1, created_at=1.0)
    then = feedback(t.event_id, "thumbs", -1, created_at=2.0)
    assert find_labels([Episode(t, (first, then))], TUTOR) == {}


def test_runs_of_the_same_prompt_vote_together_across_wordings():
    runs = [
        _run("#### 42", up("a")),
        _run("#### 42", up("b"), prompt="  what is 12 plus 30 "),
        _run("#### 40", down("c")),
    ]
    assert prompt_key(runs[0].trajectory) == prompt_key(runs[1].trajectory)
    [label] = find_labels(runs, TUTOR, max_user_share=1.0).values()
    assert label.answer == "42" and label.episodes == (0, 1, 2)
    assert label.confidence == pytest.approx(19**2 / (1 + 19**2 + 1 / 19))


def test_two_replies_alike_to_different_follow_up_questions_are_two_prompts():
    """The same reply ("3 weeks") to two cases' follow-up questions: each run's prompt is the
    case its reply joined (`TrajectoryEvent.case`), so their labels stay apart."""

    def reply(case: str, answer: str, user: str) -> Episode:
        meta = {CASE_KEY: f"{case}\nAge: 3 weeks"}
        t = trajectory("3 weeks", answer, user=user).model_copy(update={"metadata": meta})
        return Episode(t, (feedback(t.event_id, "outcome", 1.0, user=user),))

    fever = reply("my baby has a fever", "Triage: emergency", "a")
    rash = reply("my baby has a rash", "Triage: see a doctor", "b")
    level = Decision("level", LEVELS, with_level)
    grounding = {"tutor": Grounding(triage_level, mentioned_level, decision=level)}
    assert prompt_key(fever.trajectory) != prompt_key(rash.trajectory)
    labels = find_labels([fever, rash], grounding, max_user_share=1.0)
    assert sorted(lb.answer for lb in labels.values()) == ["emergency", "see a doctor"]
    examples = decision_examples([fever, rash], labels, grounding)["level"]
    assert sorted(text for _, _, text in examples) == [
        "my baby has a fever\nAge: 3 weeks",
        "my baby has a rash\nAge: 3 weeks",
    ]


def test_conflicting_users_give_no_label():
    runs = [_run("#### 42", up("a")), _run("#### 40", up("b"))]
    assert find_labels(runs, TUTOR, max_user_share=1.0) == {}
    runs = [_run("#### 42", up("a")), _run("#### 42", down("b"))]
    assert find_labels(runs, TUTOR, max_user_share=1.0) == {}


def test_a_thumbs_down_alone_says_not_this_answer_but_labels_nothing():
    assert find_labels([_run("#### 40", down())], TUTOR) == {}


def test_a_poisoner_is_capped_like_for_rewards():
    # 20 honest users, two per prompt, back each prompt's right answer; one user brings every
    # prompt three times and corrects each run to a wrong answer. Uncapped they outvote the
    # honest users everywhere; capped at a fifth of the vote mass they label nothing
    prompts = [f"What is {k} plus 1?" for k in range(10)]
    honest = [
        _run(f"#### {k + 1}", up(f"u{k}{side}"), prompt=p)
        for k, p in enumerate(prompts)
        for side in "ab"
    ]
    poison = [_run("#### 0", correction("it is 99", "mallory"), prompt=p) for p in prompts * 3]
    alone = find_labels(poison, TUTOR, max_user_share=0.2)
    assert {lb.answer for lb in alone.values()} == {"99"} and len(alone) == 10
    labels = find_labels(honest + poison, TUTOR, max_user_share=0.2)
    assert sorted(int(lb.answer) for lb in labels.values()) == list(range(1, 11))
    uncapped = find_labels(honest + poison, TUTOR, max_user_share=1.0)
    assert {lb.answer for lb in uncapped.values()} == {"99"}  # the cap is what stops them


def test_one_key_posing_as_many_users_is_capped_as_one_sender():
    """The poisoner of the test above, now as 30 fresh user ids behind one API key: each id
    is a small sender, so only the per-credential cap stops them."""
    prompts = [f"What is {k} plus 1?" for k in range(10)]
    honest = [
        _run(f"#### {k + 1}", up(f"u{k}{side}"), prompt=p)
        for k, p in enumerate(prompts)
        for side in "ab"
    ]
    poison = []
    for n, p in enumerate(prompts * 3):
        t = trajectory(p, "#### 0", user=f"fake{n}")
        said = feedback(t.event_id, "correction", None, user=f"fake{n}", text="it is 99")
        poison.append(Episode(t, (said.model_copy(update={"credential": "bot"}),)))
    anonymous = [
        Episode(e.trajectory, tuple(f.model_copy(update={"credential": None}) for f in e.feedback))
        for e in poison
    ]
    assert {lb.answer for lb in find_labels(honest + anonymous, TUTOR).values()} == {"99"}
    labels = find_labels(honest + poison, TUTOR, max_user_share=0.2)
    assert sorted(int(lb.answer) for lb in labels.values()) == list(range(1, 11))


def test_runs_of_agents_without_a_grounding_get_no_label():
    t = trajectory(QUESTION, "#### 42").model_copy(update={"agent": "other"})
    assert find_labels([Episode(t, (feedback(t.event_id),))], TUTOR) == {}


def test_the_noise_must_be_a_share_below_one_half():
    with pytest.raises(ValueError, match="label noise"):
        find_labels([], TUTOR, noise=0.5)


def test_a_fallback_answer_gets_no_opinion_vote_but_its_outcome_votes_and_an_envelope_votes():
    """The fallback's level is a default, not an answer: a thumbs on it says little. An
    outcome (the disposition a clinician assigned) says whether the level returned was right,
    whoever wrote it; the red-flag rules' emergency is an answer."""
    triage = {"triage": Grounding(triage_level, mentioned_level)}

    def run(path, output, *said):
        t = trajectory("chest pain", output).model_copy(
            update={"agent": "triage", "answered_by": path, "model_output": "garbage"}
        )
        return Episode(t, tuple(feedback(t.event_id, *s[:2], user=s[2], text=s[3]) for s in said))

    fallback = run(AnswerPath.FALLBACK, "Call if worse.\nTriage: urgent", up())
    assert episode_votes(fallback, triage["triage"], 0.05) == []
    corrected = run(AnswerPath.FALLBACK, "Triage: urgent", correction("it was an emergency"))
    [vote] = episode_votes(corrected, triage["triage"], 0.05)
    assert vote.answer == "emergency"  # a user's correction is the user's word either way
    confirmed = run(
        AnswerPath.FALLBACK, "Call if worse.\nTriage: urgent", ("outcome", 1.0, "c", None)
    )
    [vote] = episode_votes(confirmed, triage["triage"], 0.05)
    assert (vote.answer, vote.weight) == ("urgent", pytest.approx(math.log(19)))
    wrong = run(AnswerPath.FALLBACK, "Triage: urgent", ("outcome", 0.0, "c", None))
    [vote] = episode_votes(wrong, triage["triage"], 0.05)
    assert (vote.answer, vote.weight) == ("urgent", pytest.approx(-math.log(19)))
    envelope = run(AnswerPath.ENVELOPE, "Call 999 now.\nTriage: emergency", up())
    [vote] = episode_votes(envelope, triage["triage"], 0.05)
    assert vote.answer == "emergency"
