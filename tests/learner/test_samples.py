import pytest

from agents.events import AnswerPath
from learner.advantages import RunningBaseline
from learner.episodes import Episode
from learner.labels import Grounding, Label
from learner.rewards import batch_rewards
from learner.samples import (
    build_training_data,
    group_key,
    judged_only,
    reads_tool_output,
    restated_pairs,
    sample_advantages,
)
from tests.learner.learner_events import (
    completion_ids,
    feedback,
    prompt_ids,
    tokenizer,
    trajectory,
)
from tools.verifiers import mentioned_level, triage_level, with_level


def _build(episodes, **kw):
    rewards = batch_rewards(
        [e.feedback for e in episodes],
        [[s.index for s in e.trajectory.model_steps] for e in episodes],
        1.0,
        None,
    )
    kw.setdefault("normalise_rewards", False)
    tok = tokenizer()
    return build_training_data(
        episodes,
        rewards,
        encode=lambda t: tok(t, add_special_tokens=False)["input_ids"],
        eos_id=tok.eos_token_id,
        **kw,
    )


def _ep(t, *fb):
    return Episode(t, tuple(fb))


def test_one_sample_per_rewarded_model_step_with_logged_ids():
    tool = trajectory(tool_turn=True, logprobs=True)
    blind = trajectory(with_ids=False)
    data = _build(
        [
            _ep(tool, feedback(tool.event_id, "thumbs", 1)),
            _ep(blind, feedback(blind.event_id, "thumbs", -1)),
        ]
    )
    assert data.skipped_steps == 1 and data.used == [0]  # never re-tokenised
    first, answer = data.samples
    assert first.prompt_ids == prompt_ids("What is 12 plus 30?")
    assert first.completion_ids == completion_ids("<tool_call>")
    assert answer.prompt_ids == prompt_ids("What is 12 plus 30? 42")
    assert len(answer.behaviour_logprobs) == len(answer.completion_ids)
    assert (first.reward, first.policy_version, first.group) == (1.0, 0, group_key(tool))


def test_mismatched_logged_logprobs_are_not_used_as_behaviour():
    t = trajectory(logprobs=True)
    step = t.model_steps[0].model_copy(update={"logprobs": [-1.0]})
    t = t.model_copy(update={"steps": [step]})
    [s] = _build([_ep(t, feedback(t.event_id))]).samples
    assert s.behaviour_logprobs is None


def test_a_correction_becomes_a_preference_pair():
    t = trajectory(answer="The answer is 41.")
    data = _build([_ep(t, feedback(t.event_id, "correction", None, text="The answer is 42."))])
    [pair] = data.pairs
    assert data.samples == [] and data.used == [0]
    assert pair.prompt_ids == prompt_ids("What is 12 plus 30?")
    assert pair.chosen_ids == completion_ids("The answer is 42.")  # text + eos
    assert pair.rejected_ids == completion_ids("The answer is 41.")


def test_a_correction_of_an_answer_read_off_a_tool_is_not_a_pair():
    # the calculator said 42 and the model said so: a pair "42 loses to 41" would teach it to
    # contradict its tool; the run still learns from its thumbs-down
    t = trajectory(tool_turn=True, answer="The answer is 42.")
    data = _build(
        [
            _ep(
                t,
                feedback(t.event_id, "correction", None, text="The answer is 41."),
                feedback(t.event_id, "thumbs", -1),
            )
        ]
    )
    assert data.pairs == [] and data.skipped_corrections == 1
    assert len(data.samples) == 2 and data.used == [0]
    first = _ep(t, feedback(t.event_id, "correction", None, text="CALL calculator: 12-30", turn=0))
    [pair] = _build([first]).pairs  # naming the call turn (before any tool output) is a pair
    assert pair.rejected_ids == completion_ids("<tool_call>")


def test_grpo_inside_a_group_rloo_outside_then_the_batch_std():
    # samples 0, 1: one group of two episodes; 2, 3, 4: single prompts
    args = ([1.0, -1.0, 1.0, 0.0, -1.0], ["g", "g", "a", "b", "c"], [0, 1, 2, 3, 4], "rloo")
    centred, _ = sample_advantages(*args, RunningBaseline(), scale_batch_std=False)
    assert centred == pytest.approx([1.0, -1.0, 1.5, 0.0, -1.5])  # group mean; r - mean(others)
    scaled, _ = sample_advantages(*args, RunningBaseline())
    std = 1.0  # unbiased std of (1, -1, 1, 0, -1): sum of squares 4 over 4
    assert scaled == pytest.approx([c / (std + 1e-4) for c in centred])


def test_batch_std_scaling_keeps_a_tied_group_at_zero_and_a_noisy_one_small():
    # group t: four equal thumbs-ups; group n: ratings 4, 5, 4, 4 (no real difference);
    # group s: a real split between right (+1) and wrong (-1) answers
    rewards = [1.0] * 4 + [0.5, 1.0, 0.5, 0.5] + [1.0, -1.0, 1.0, -1.0]
    groups = ["t"] * 4 + ["n"] * 4 + ["s"] * 4
    adv, _ = sample_advantages(rewards, groups, list(range(12)), "rloo", RunningBaseline())
    assert adv[:4] == [0.0] * 4
    assert max(abs(a) for a in adv[4:8]) < 0.5  # per-group std would make the 5 stars +1.5
    assert min(abs(a) for a in adv[8:]) > 0.9


def test_two_turns_of_one_episode_are_not_a_group():
    adv, _ = sample_advantages(
        [1.0, 0.0, 0.0], ["g", "g", "h"], [0, 0, 1], "rloo", RunningBaseline(), False
    )
    assert adv == pytest.approx([1.0, -0.5, -0.5])  # all three are "singles": RLOO


def test_running_baseline_carries_across_rounds():
    adv, state = sample_advantages(
        [1.0, 0.0], ["a", "b"], [0, 1], "running", RunningBaseline(), False
    )
    assert adv == pytest.approx([0.5, -0.5]) and (state.mean, state.count) == (0.5, 2)
    adv, state = sample_advantages([1.0], ["c"], [0], "running", state, False)
    assert adv == pytest.approx([0.5]) and state.mean == pytest.approx(0.55)


def test_identical_first_prompts_share_a_group_key():
    a, b = trajectory(answer="x"), trajectory(answer="y")
    c = trajectory(prompt="Something else")
    assert group_key(a) == group_key(b) != group_key(c)
    assert group_key(trajectory(group="task-7")) == "g:task-7"


def test_a_lone_run_users_only_judged_goes_to_kto_and_a_group_stays_policy_gradient():
    lone_up = trajectory("What is 1 plus 2?", "3")
    lone_down = trajectory("What is 2 plus 2?", "5")
    lone_neutral = trajectory("What is 3 plus 2?", "5")
    corrected = trajectory("What is 4 plus 2?", "7")
    grouped = [
        trajectory("What is 9 plus 9?", a, user=f"g{i}") for i, a in enumerate("18 17".split())
    ]
    episodes = [
        _ep(lone_up, feedback(lone_up.event_id, "thumbs", 1)),
        _ep(lone_down, feedback(lone_down.event_id, "rating", 1)),
        _ep(lone_neutral, feedback(lone_neutral.event_id, "rating", 3)),
        _ep(
            corrected,
            feedback(corrected.event_id, "thumbs", -1),
            feedback(corrected.event_id, "correction", None, text="6"),
        ),
        *(
            _ep(t, feedback(t.event_id, "thumbs", 1 - 2 * i, user=f"g{i}"))
            for i, t in enumerate(grouped)
        ),
    ]
    data = _build(episodes, judged_only=judged_only)
    assert [(j.completion_ids, j.desirable, j.weight) for j in data.judged] == [
        (completion_ids("3"), True, 1.0),
        (completion_ids("5"), False, 1.0),
    ]
    # the neutral rating trains nothing; the corrected run and the group stay policy gradient
    assert sorted(s.completion_ids for s in data.samples) == sorted(
        completion_ids(a) for a in ("7", "18", "17")
    )
    assert data.used == [0, 1, 3, 4, 5]
    without = _build(episodes)  # the default predicate: no KTO at all
    assert without.judged == [] and len(without.samples) == 6


def test_a_capped_users_judgement_weighs_less_in_kto():
    runs = [trajectory(f"What is {i} plus 1?", "x", user="loud") for i in range(4)]
    runs.append(trajectory("What is 9 plus 1?", "10", user="quiet"))
    episodes = [_ep(t, feedback(t.event_id, "thumbs", 1, user=t.user_id)) for t in runs]
    rewards = batch_rewards([e.feedback for e in episodes], [[0]] * 5, 0.5, None)
    tok = tokenizer()
    data = build_training_data(
        episodes,
        rewards,
        encode=lambda t: tok(t, add_special_tokens=False)["input_ids"],
        eos_id=tok.eos_token_id,
        judged_only=judged_only,
    )
    weights = [j.weight for j in data.judged]
    assert weights[-1] == 1.0 and all(w == pytest.approx(0.25) for w in weights[:4])


def test_a_single_judged_answer_stays_policy_gradient():
    t = trajectory("What is 1 plus 2?", "3")
    data = _build([_ep(t, feedback(t.event_id, "thumbs", 1))], judged_only=judged_only)
    assert data.judged == [] and len(data.samples) == 1  # KTO needs two answers for its z0


@pytest.mark.parametrize("path", [AnswerPath.ENVELOPE, AnswerPath.FALLBACK])
def test_a_run_answered_by_an_envelope_or_fallback_trains_nothing_from_its_feedback(path):
    """Its feedback judges a text the model did not write: no sample, no pair, counted."""
    own = trajectory(answer="Triage: self-care")
    replaced = own.model_copy(
        update={
            "answered_by": path,
            "output": "Call 999.\nTriage: emergency",
            "model_output": own.output,
        }
    )
    data = _build(
        [
            _ep(replaced, feedback(replaced.event_id, "thumbs", 1)),
            _ep(replaced, feedback(replaced.event_id, "correction", None, text="Triage: urgent")),
        ]
    )
    assert data.samples == [] and data.pairs == [] and data.used == []
    assert data.replaced_answers == 2
    kept = _build([_ep(own, feedback(own.event_id, "thumbs", 1))])
    assert len(kept.samples) == 1 and kept.replaced_answers == 0


def _triage_run(answer: str, prompt: str = "my chest feels tight"):
    t = trajectory(prompt, answer).model_copy(
        update={"agent": "triage", "answered_by": AnswerPath.FALLBACK}
    )
    return Episode(t, ())


def _restated(episodes, answer="urgent", grounding=None):
    tok = tokenizer()
    grounding = grounding or {
        "triage": Grounding(triage_level, mentioned_level, restate=with_level)
    }
    label = Label("p", answer, 0.95, tuple(range(len(episodes))), ("c",))
    return restated_pairs(
        episodes,
        {"p": label},
        grounding,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
        encode=lambda text: tok(text, add_special_tokens=False)["input_ids"],
        eos_id=tok.eos_token_id,
    )


def test_a_labelled_run_that_stated_another_level_gives_a_pair_differing_in_the_level_alone():
    """The fallback answered the user, but the model's own reply said self-care: its own words
    with the clinician's level win over them as written, token for token up to the level."""
    tok = tokenizer()
    wrong = _triage_run("Rest at home and drink water.\nTriage: self-care")
    right = _triage_run("Get help today.\nTriage: urgent")
    [pair] = _restated([wrong, right])
    step = wrong.trajectory.model_steps[-1]
    assert pair.prompt_ids == step.prompt_token_ids
    assert pair.rejected_ids == step.completion_token_ids
    chosen = tok.decode(pair.chosen_ids, skip_special_tokens=True)
    assert chosen == "Rest at home and drink water.\nTriage: urgent"
    assert pair.chosen_ids[-1] == tok.eos_token_id  # it ends as the logged reply ended
    assert (
        tok.decode(pair.chosen_ids[pair.nll_from :], skip_special_tokens=True).strip() == "urgent"
    )
    head = tok("Rest at home and drink water.\nTriage:", add_special_tokens=False)["input_ids"]
    assert pair.chosen_ids[: len(head)] == step.completion_token_ids[: len(head)]


def test_a_reply_with_no_level_gets_the_level_line_and_a_question_or_no_restate_gets_none():
    tok = tokenizer()
    [pair] = _restated([_triage_run("Rest at home and drink water.")], answer="see a doctor")
    text = tok.decode(pair.chosen_ids, skip_special_tokens=True)
    assert text == "Rest at home and drink water.\nTriage: see a doctor"
    assert _restated([_triage_run("How old is the baby?")]) == []  # it asked: not a level
    assert _restated([_triage_run("Triage: self-care")], answer="ask") == []
    plain = {"triage": Grounding(triage_level, mentioned_level)}  # the pack cannot restate
    assert _restated([_triage_run("Triage: self-care")], grounding=plain) == []


def test_a_team_agents_turn_after_its_own_tool_output_reads_it():
    """A run through `/v1/chat/completions` has no tool steps: its tool's output is a `tool`
    message in the next call's prompt, and that turn reads it as our agents' would."""
    from learner.round_data import credited_turns

    ours = trajectory(tool_turn=True)
    call, _, answer = ours.steps
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    answer = answer.model_copy(update={"index": 1, "messages": [*call.messages, result]})
    theirs = ours.model_copy(update={"steps": [call, answer], "agent": "team-bot"})
    fixed = feedback(theirs.event_id, "correction", None, text="The answer is 41.")
    episode = Episode(theirs, (fixed, feedback(theirs.event_id, "thumbs", 1)))
    assert credited_turns(episode) == {0}  # the answer turn read the tool: not credited
    data = _build([episode])
    assert data.pairs == [] and data.skipped_corrections == 1  # no pair against the tool


def test_tool_turns_a_prompt_starts_with_are_not_an_output_of_the_run():
    """Few-shot examples (the packs' `EXAMPLE`: a call, its tool result, the answer) put a
    `tool` message in every call's prompt; only one the run itself added means a turn read a
    tool's output. Was: every turn of a pack with such an example counted as after a tool,
    so a round with `train_after_tool` off credited nothing and `arloop demo --quick` waited
    for a round that never came."""
    from learner.round_data import credited_turns

    example = [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "tool", "tool_call_id": "e1", "content": "2"},
        {"role": "assistant", "content": "#### 2"},
    ]
    t = trajectory()
    [step] = t.model_steps
    step = step.model_copy(update={"messages": [*example, *step.messages]})
    alone = t.model_copy(update={"steps": [step]})
    assert not reads_tool_output(alone, step)
    assert credited_turns(Episode(alone, (feedback(alone.event_id, "thumbs", -1),))) == {0}
