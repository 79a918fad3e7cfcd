"""Live traffic and the report card: each tenant's own figures, right, in bounded memory."""

from __future__ import annotations

import random
import tracemalloc

from agents.events import (
    STREAM_EVAL_TRAJECTORIES,
    STREAM_FEEDBACK,
    STREAM_TRAJECTORIES,
    FeedbackEvent,
    FeedbackKind,
    ModelStep,
    StreamShards,
    TrajectoryEvent,
    encode,
    new_id,
)
from deploy.agent_api import traffic
from deploy.agent_api.traffic import RecentIds, Tally
from learner.policy.registry import PolicyRegistry
from tests.fakes.scripted_llm import Reply
from tests.shard_ids import spread_ids

KEYS = {"acme": "acme-key-" + "a" * 24, "globex": "globex-key-" + "g" * 24}


def as_tenant(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def test_a_tenant_sees_only_its_own_traffic_and_report_card(start_api, llm, redis_client):
    llm.responder = lambda request: Reply(content="2 and 3 make 5.", fingerprint="v0")
    PolicyRegistry(redis_client).ensure_base("tiny")
    api = start_api(api_keys=[{"key": k, "name": t, "tenant": t} for t, k in KEYS.items()])
    for value in (1, 1, -1):
        run = api.http.post(
            "/v1/agents/tutor/runs",
            json={"input": "What is 2 and 3?", "user_id": "u1"},
            headers=as_tenant("acme"),
        ).json()
        posted = api.http.post(
            "/v1/feedback",
            json={
                "trajectory_id": run["trajectory_id"],
                "feedback_token": run["feedback_token"],
                "kind": "thumbs",
                "value": value,
            },
            headers=as_tenant("acme"),
        )
        assert posted.status_code == 202, posted.text

    def shown(tenant: str) -> tuple[dict, dict]:
        board = api.http.get("/v1/dashboard", headers=as_tenant(tenant)).json()
        card = api.http.get("/v1/report-card", headers=as_tenant(tenant)).json()["agents"]
        rows = {r["version"]: r["traffic"] for r in board["versions"]}
        return rows, {(c["agent"], c["version"]): c["runs"] for c in card}

    rows, card = shown("acme")
    assert {k: rows["v0"][k] for k in ("runs", "rated", "feedback", "thumbs_up")} == {
        "runs": 3,
        "rated": 3,
        "feedback": 3,
        "thumbs_up": 2,
    }
    assert card == {("tutor", "v0"): 3}
    rows, card = shown("globex")  # before: acme's 3 runs and 3 thumbs
    assert rows == {"v0": None} and card == {}


def step(version: str, size: int = 0) -> ModelStep:
    messages = [{"role": "user", "content": "x" * size}] if size else []
    return ModelStep(
        index=0, messages=messages, output="5", model="m", policy_version=version, latency_ms=1.0
    )


def trajectory(user: str, version: str = "v1", size: int = 0, **meta) -> TrajectoryEvent:
    return TrajectoryEvent(
        event_id=new_id("traj"),
        thread_id="th",
        agent="tutor",
        user_id=user,
        input="How many apples are left?",
        output="There are 7 apples left.",
        policy_version=version,
        steps=[step(version, size)],
        started_at=0.0,
        finished_at=1.0,
        metadata=meta,
    )


def feedback(t: TrajectoryEvent, kind: FeedbackKind, value: float) -> FeedbackEvent:
    return FeedbackEvent(
        event_id=new_id("fb"),
        trajectory_id=t.trajectory_id,
        user_id=t.user_id,
        kind=kind,
        value=value,
        policy_version=t.policy_version,
    )


def test_the_figures_are_right_per_tenant_on_a_normal_workload(redis_client):
    """Runs of two tenants and one with no key here; a third of the runs unrated, some rated
    twice (a thumbs and a rating), polled as it goes."""
    rng = random.Random(3)
    tally = Tally({"default", "acme"}, rated_window=300)
    expected = {t: dict.fromkeys(("runs", "rated", "feedback", "up", "down"), 0) for t in KEYS}
    expected["default"] = expected.pop("globex")
    users = {"default": "u_aaaa", "acme": "acme:u_bbbb", "gone": "gone:u_cccc"}
    for i in range(3000):
        tenant = rng.choice(list(users))
        t = trajectory(users[tenant])
        redis_client.xadd(STREAM_TRAJECTORIES, encode(t))
        posts = []
        if rng.random() < 2 / 3:
            posts.append(feedback(t, FeedbackKind.THUMBS, rng.choice((1, -1))))
        if rng.random() < 0.25:
            posts.append(feedback(t, FeedbackKind.RATING, 4))
        for f in posts:
            redis_client.xadd(STREAM_FEEDBACK, encode(f))
        if tenant != "gone":
            seen = expected[tenant]
            seen["runs"] += 1
            seen["rated"] += bool(posts)
            seen["feedback"] += len(posts)
            seen["up"] += sum(f.kind is FeedbackKind.THUMBS and f.value == 1 for f in posts)
            seen["down"] += sum(f.kind is FeedbackKind.THUMBS and f.value == -1 for f in posts)
        if i % 250 == 0:
            tally.refresh(redis_client)
    tally.refresh(redis_client)
    for tenant, seen in expected.items():
        shown = tally.traffic(tenant)["v1"]
        got = ("runs", "rated", "feedback", "thumbs_up", "thumbs_down")
        assert [shown[k] for k in got] == list(seen.values()), tenant
        assert tally.report_card(tenant)[0]["runs"] == seen["runs"]
    assert set(tally.tenants) == {"default", "acme"}  # a tenant with no key here is not kept
    assert tally.traffic("gone") == {} and tally.report_card("gone") == []


def test_stress_cases_are_the_deployments_and_shown_to_every_tenant(redis_client):
    redis_client.xadd(
        STREAM_EVAL_TRAJECTORIES, encode(trajectory("u_op", **{"arloop.stress": "long"}))
    )
    redis_client.xadd(STREAM_TRAJECTORIES, encode(trajectory("acme:u_bbbb")))
    tally = Tally({"default", "acme"})
    tally.refresh(redis_client)
    [acme] = tally.report_card("acme")
    [default] = tally.report_card("default")
    assert acme["runs"] == 1 and default["runs"] == 0
    assert acme["stress"] == default["stress"] == {"long": {"runs": 1, "passed": 1, "rate": 1.0}}


def test_the_rated_ids_stay_bounded_and_remember_the_latest_window():
    ids = RecentIds(window=1000, chunk=100)
    names = [f"traj_{i:032x}" for i in range(200_000)]
    assert all(ids.add(n) for n in names)
    assert len(ids) <= 1100 and ids.nbytes() < 16_000  # 200,000 ids in a set: about 23 MB
    assert not any(ids.add(n) for n in names[-1000:])  # the latest window: known
    assert ids.add(names[-1200])  # older than the window and its chunk: forgotten, counted again


def test_versions_and_cards_stay_bounded_by_the_most_recent(redis_client):
    n = traffic.MAX_CARDS + 40
    for i in range(n):
        t = trajectory("u_aaaa", version=f"v{i}")
        redis_client.xadd(STREAM_TRAJECTORIES, encode(t))
        redis_client.xadd(STREAM_FEEDBACK, encode(feedback(t, FeedbackKind.THUMBS, 1)))
    tally = Tally()
    tally.refresh(redis_client)
    shown = tally.traffic()
    assert len(shown) == traffic.MAX_VERSIONS and shown[f"v{n - 1}"]["rated"] == 1
    card = tally.report_card()  # one card per agent and version
    assert len(card) == traffic.MAX_CARDS and {c["version"] for c in card} >= {f"v{n - 1}"}


def test_a_cards_graph_nodes_stay_bounded_whatever_names_clients_send(redis_client):
    """Node names come from clients (`X-Arloop-Node`): a card names `MAX_NODES` of them and
    counts the rest together, so no client grows the tally without end."""
    n = traffic.MAX_NODES + 10
    for i in range(n):
        t = trajectory("u_aaaa")
        t.steps[0] = t.steps[0].model_copy(update={"node": f"node{i}"})
        redis_client.xadd(STREAM_TRAJECTORIES, encode(t))
    tally = Tally()
    tally.refresh(redis_client)
    [card] = tally.report_card()
    nodes = card["nodes"]
    assert len(nodes) == traffic.MAX_NODES + 1 and nodes[traffic.OTHER_NODES]["calls"] == 10
    assert sum(c["calls"] for c in nodes.values()) == n and nodes["node0"]["calls"] == 1


def test_one_poll_holds_a_batch_not_all_it_reads(redis_client):
    """2,000 runs of 4 KB since the last poll: read 100 at a time (1,000 before: 10x the peak)."""
    for _ in range(2000):
        redis_client.xadd(STREAM_TRAJECTORIES, encode(trajectory("u_aaaa", size=4000)))
    tally = Tally()
    tracemalloc.start()
    try:
        tally.refresh(redis_client)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tally.traffic()["v1"]["runs"] == 2000
    assert peak < 4_000_000, peak


def test_every_shards_runs_and_feedback_are_counted(redis_client):
    shards = StreamShards(3)
    for i, run in zip(range(12), spread_ids(shards), strict=False):  # 4 runs on each shard
        t = trajectory("u_aaaa").model_copy(update={"event_id": run})
        shard = shards.of(t.trajectory_id)
        redis_client.xadd(shards.trajectories(shard), encode(t))
        thumbs = feedback(t, FeedbackKind.THUMBS, 1 if i % 3 else -1)
        redis_client.xadd(shards.feedback(shard), encode(thumbs))
    tally = Tally(shards=shards)
    tally.refresh(redis_client)
    shown = tally.traffic()["v1"]
    got = [shown[k] for k in ("runs", "rated", "feedback", "thumbs_up", "thumbs_down")]
    assert got == [12, 12, 12, 8, 4]
    assert tally.report_card()[0]["runs"] == 12
