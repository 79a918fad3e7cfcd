"""The routes that read the streams back, on streams split into three shards: every shard's
runs and feedback, in order, each once over the pages; a run found whole in its own shard; the
dashboard's and report card's counts; an erasure that clears the user from every shard. Before,
they read the unsharded stream names only: empty lists, a 404, zero counts, nothing erased."""

from __future__ import annotations

import json

import pytest

from agents.events import StreamShards, decode
from deploy.agent_api import app as agent_app
from tests.deploy.agent_api.test_review import REVIEWER, keys
from tests.fakes.scripted_llm import Reply
from tests.shard_ids import spread_new_id

SHARDS = StreamShards(3)


def logged(api, llm, n: int) -> list[dict]:
    """`n` runs of three users, oldest first, each with one thumbs (up for the odd ones), on
    the shards in turn."""
    out = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agent_app, "new_id", spread_new_id(SHARDS))
        for i in range(n):
            llm.push(Reply(content=f"{i}"))
            body = api.run(f"What is {i}+1?", user=f"u{i % 3}").json()
            token = {k: body[k] for k in ("trajectory_id", "feedback_token")}
            thumbs = api.feedback(kind="thumbs", value=1 if i % 2 else -1, **token)
            assert thumbs.status_code == 202, thumbs.text
            out.append(body)
    assert len({SHARDS.of(b["trajectory_id"]) for b in out}) > 1  # the runs spread
    return out


def follow(api, path: str, headers: dict | None = None, **params) -> list[dict]:
    """Every item of every page, following `next_cursor`."""
    items, cursor = [], None
    while True:
        query = params | ({"cursor": cursor} if cursor else {})
        answer = api.http.get(path, params=query, headers=headers or {})
        assert answer.status_code == 200, answer.text
        items += answer.json()["items"]
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return items


def ids(items: list[dict]) -> list[str]:
    return [i["trajectory_id"] for i in items]


def test_every_shards_runs_and_feedback_are_listed_in_order_once(start_api, llm):
    api = start_api(stream_shards=3, api_keys=keys())
    runs = logged(api, llm, 12)
    oldest = ids(runs)
    listed = follow(api, "/v1/runs", limit=5)
    assert ids(listed) == oldest[::-1]
    assert ids(api.http.get("/v1/runs").json()["items"]) == oldest[::-1]
    assert all(i["cursor"].endswith(f".{SHARDS.of(i['trajectory_id'])}") for i in listed)
    assert [i["feedback"]["thumbs_up"] for i in listed] == [i % 2 for i in range(12)][::-1]
    for item in listed:  # found whole in its shard, with its feedback
        tid = item["trajectory_id"]
        run = api.http.get(f"/v1/runs/{tid}").json()
        assert run["cursor"] == item["cursor"] and len(run["feedback"]) == 1, run
        assert api.http.get(f"/v1/runs/{tid}", params={"cursor": item["cursor"]}).json() == run
    assert ids(follow(api, "/v1/feedback", limit=5)) == oldest
    lines = [json.loads(line) for line in api.http.get("/v1/feedback/export").text.splitlines()]
    assert [line["trajectory"]["event_id"] for line in lines] == oldest
    assert all(len(line["feedback"]) == 1 for line in lines)
    queued = follow(api, "/v1/review/queue", REVIEWER, sample=1, limit=5)
    assert ids(queued) == oldest[::-1]
    verdict = api.http.post(
        f"/v1/review/{queued[0]['trajectory_id']}",
        json={"score": 1, "cursor": queued[0]["cursor"]},
        headers=REVIEWER,
    )
    assert verdict.status_code == 202, verdict.text


def test_the_counts_and_an_erasure_take_in_every_shard(start_api, llm, redis_client):
    api = start_api(stream_shards=3)
    runs = logged(api, llm, 12)
    [card] = api.http.get("/v1/report-card").json()["agents"]
    assert card["runs"] == 12
    streams = api.http.get("/v1/dashboard").json()["streams"]
    lengths = {s["stream"]: s["length"] for s in streams["streams"]}
    assert set(lengths) == {*SHARDS.all_trajectories(), *SHARDS.all_feedback()}
    assert sum(lengths[s] for s in SHARDS.all_trajectories()) == 12
    assert sum(lengths[s] for s in SHARDS.all_feedback()) == 12
    erased = api.http.delete("/v1/users/u0").json()
    assert erased["events"] == 8  # u0's 4 runs and their 4 thumbs
    left = {
        decode(f).trajectory_id
        for s in SHARDS.all_trajectories()
        for _, f in redis_client.xrange(s)
    }
    assert left == {r["trajectory_id"] for i, r in enumerate(runs) if i % 3}


def test_every_shards_runs_are_listed_and_found_on_a_cluster(start_api, llm, cluster_url):
    api = start_api(redis_url=cluster_url, redis_cluster=True, stream_shards=3)
    runs = logged(api, llm, 9)
    listed = follow(api, "/v1/runs", limit=4)
    assert ids(listed) == ids(runs)[::-1]
    assert ids(follow(api, "/v1/feedback", limit=4)) == ids(runs)
    for item in listed:
        run = api.http.get(f"/v1/runs/{item['trajectory_id']}").json()
        assert run["cursor"] == item["cursor"] and len(run["feedback"]) == 1, run
