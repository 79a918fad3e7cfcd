"""What a round is given for a team's own agent (a pack with `run`): its answer readers under
the pack's name, so feedback on its runs through `/v1/chat/completions` becomes labels."""

from __future__ import annotations

from agents.packs.base import Pack
from deploy.learn.plan import groundings
from learner.episodes import Episode
from learner.labels import find_labels
from tests.examples.openai_sdk_tutor.pack import NAME, pack
from tests.learner.learner_events import feedback, trajectory
from tools.verifiers import final_number


def test_a_team_agents_feedback_becomes_labels_under_its_packs_name():
    team = pack(tutoring_eval_size=3)
    grounding = groundings([team], "line")
    assert set(grounding) == {NAME} and grounding[NAME].tools == ()
    assert grounding[NAME].answer_of is final_number
    runs = [
        trajectory("What is 2+3?", "It is 5.\n#### 5", user=f"u{i}").model_copy(
            update={"agent": NAME}
        )
        for i in range(2)
    ]
    episodes = [
        Episode(t, (feedback(t.event_id, "thumbs", 1, user=f"u{i}"),)) for i, t in enumerate(runs)
    ]
    [label] = find_labels(episodes, grounding, max_user_share=1.0).values()
    assert (label.answer, label.episodes) == ("5", (0, 1)) and label.confidence > 0.9
    # without answer readers a team's agent learns from its feedback alone
    assert groundings([Pack("quiet-bot", run=lambda *args: "")], "line") == {}
