"""The annotation queue over real HTTP and Redis: runs picked by rule for a reviewer's key
only, and a verdict recorded as a `review` feedback event the learner reads as a label."""

from __future__ import annotations

from agents.events import STREAM_FEEDBACK, STREAM_TRAJECTORIES, FeedbackKind, decode
from learner.episodes import Episode
from learner.labels import Grounding, find_labels
from tests.deploy.agent_api.test_runs_view import USER_KEY, guarded_specs, seed
from tests.fakes.scripted_llm import Reply

REVIEWER_KEY = "dr-lee-key-" + "r" * 20
REVIEWER = {"Authorization": f"Bearer {REVIEWER_KEY}"}
ALICE = {"Authorization": f"Bearer {USER_KEY}"}


def keys() -> list:
    reviewer = {
        "key": REVIEWER_KEY,
        "name": "dr-lee",
        "identity": "user",
        "user": "dr-lee",
        "scopes": ["review"],
    }
    alice = {"key": USER_KEY, "name": "alice", "identity": "user", "user": "alice"}
    return ["test-key", reviewer, alice]


def queue(api, **params) -> dict:
    answer = api.http.get("/v1/review/queue", params=params, headers=REVIEWER)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_queue_picks_runs_by_rule_for_reviewers_only(start_api, llm):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    runs = seed(api, llm)
    # the verifier passed the solver's answer; its user says thumbs down: a disagreement
    token = {k: runs["solver"][k] for k in ("trajectory_id", "feedback_token")}
    assert api.feedback(kind="thumbs", value=-1, **token).status_code == 202
    picked = {i["trajectory_id"]: i["reasons"] for i in queue(api, sample=0)["items"]}
    assert picked == {
        runs["solver"]["trajectory_id"]: ["disagreement"],
        runs["fallback"]["trajectory_id"]: ["fallback"],
    }
    # every run of the tenant is in a sample of 1; none is in a sample of 0 (alice's too:
    # a reviewer sees every user of its tenant)
    everything = queue(api, sample=1)["items"]
    assert len(everything) == 5 and all("sample" in i["reasons"] for i in everything)
    only = queue(api, sample=1, reason="fallback")["items"]
    assert [i["trajectory_id"] for i in only] == [runs["fallback"]["trajectory_id"]]
    # a plain user's key, or a backend's key without the scope: refused
    for headers in (ALICE, {}):
        refused = api.http.get("/v1/review/queue", headers=headers)
        assert refused.status_code == 403 and "'review' scope" in refused.json()["detail"]
        verdict = api.http.post(
            f"/v1/review/{runs['fallback']['trajectory_id']}", json={"score": 1}, headers=headers
        )
        assert verdict.status_code == 403
    assert (
        api.http.get("/v1/review/queue", params={"reason": "whim"}, headers=REVIEWER).status_code
        == 422
    )
    # kind `review` is not a user's to send
    token = {k: runs["tool"][k] for k in ("trajectory_id", "feedback_token")}
    assert api.feedback(kind="review", value=1, **token).status_code == 422


def test_a_verdict_is_a_review_event_and_a_label(start_api, llm, redis_client):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    llm.push(Reply(content="4"))
    wrong = api.run("What is 2+3?", user="bob").json()
    token = {k: wrong[k] for k in ("trajectory_id", "feedback_token")}
    assert api.feedback(kind="thumbs", value=1, **token).status_code == 202  # a user liked it
    tid = wrong["trajectory_id"]
    [item] = queue(api, sample=1)["items"]
    verdict = {"score": 0, "text": "5", "cursor": item["cursor"]}
    answer = api.http.post(f"/v1/review/{tid}", json=verdict, headers=REVIEWER)
    assert answer.status_code == 202, answer.text
    # recorded through the feedback intake: a `review` event from source `review`, the
    # reviewer's stored id as its sender
    events = [decode(f) for _, f in redis_client.xrange(STREAM_FEEDBACK)]
    review = events[-1]
    assert review.event_id == answer.json()["event_id"]
    assert (review.kind, review.source, review.value, review.text) == (
        FeedbackKind.REVIEW,
        "review",
        0.0,
        "5",
    )
    assert review.user_id == api.stored("dr-lee") and review.credential == "dr-lee"
    assert (review.trajectory_id, review.agent, review.reward) == (tid, "tutor", -1.0)
    # the run left the queue; a second verdict is refused; the run shows its review
    assert queue(api, sample=1)["items"] == []
    again = api.http.post(f"/v1/review/{tid}", json={"score": 1}, headers=REVIEWER)
    assert again.status_code == 409
    run = api.http.get(f"/v1/runs/{tid}", headers=REVIEWER).json()
    assert [f["kind"] for f in run["feedback"]] == ["thumbs", "review"]
    reviewed = api.http.get("/v1/runs", params={"feedback": "reviewed"}).json()["items"]
    assert [i["trajectory_id"] for i in reviewed] == [tid]
    # the learner's label code: the reviewer's "5" outweighs the user's thumbs up on "4"
    [trajectory] = [decode(f) for _, f in redis_client.xrange(STREAM_TRAJECTORIES)]
    episode = Episode(trajectory, tuple(events))
    read = lambda text: text.strip() or None  # noqa: E731
    labels = find_labels([episode], {"tutor": Grounding(answer_of=read, reference_from=read)})
    [label] = labels.values()
    assert label.answer == "5" and label.confidence > 0.99
    assert label.senders == tuple(sorted([api.stored("bob"), api.stored("dr-lee")]))
    # without the review, the same feedback labels the wrong answer
    user_only = Episode(trajectory, tuple(events[:-1]))
    [label] = find_labels([user_only], {"tutor": Grounding(read, read)}).values()
    assert label.answer == "4"


def test_bad_verdicts_are_clear_4xx(start_api, llm):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    llm.push(Reply(content="4"))
    tid = api.run("2+2?", user="bob").json()["trajectory_id"]
    post = lambda body, t=tid: api.http.post(f"/v1/review/{t}", json=body, headers=REVIEWER)  # noqa: E731
    assert post({"score": 2}).status_code == 422
    assert post({}).status_code == 422
    assert post({"score": 1, "extra": 1}).status_code == 422
    assert post({"score": 1}, "traj_nothing").status_code == 404
    assert post({"score": 1, "cursor": "abc"}).status_code == 422
    assert post({"score": 1, "text": "  "}).status_code == 202  # a blank text is no text


def test_erasing_a_user_erases_the_reviews_of_their_runs(start_api, llm, redis_client):
    api = start_api(specs=guarded_specs(), api_keys=keys())
    llm.push(Reply(content="4"), Reply(content="6"))
    bob = api.run("2+2?", user="bob").json()["trajectory_id"]
    carol = api.run("3+3?", user="carol").json()["trajectory_id"]
    for tid in (bob, carol):
        verdict = {"score": 1, "text": "fine"}
        assert api.http.post(f"/v1/review/{tid}", json=verdict, headers=REVIEWER).status_code == 202
    assert api.http.delete("/v1/users/bob").status_code == 200
    left = [decode(f) for _, f in redis_client.xrange(STREAM_FEEDBACK)]
    assert [e.trajectory_id for e in left] == [carol]  # the reviewer's other verdict stays
