"""The dashboard's data from Redis alone: canary, delivery to the policy servers, versions."""

from __future__ import annotations

import json
import re
import time

import redis

from agents.events import LEARNER_LEASE, LEARNER_STATUS, STREAM_FEEDBACK, serving_key
from deploy.agent_api.dashboard_data import LAGGING_AFTER_S, learner_state, snapshot
from deploy.agent_api.traffic import Tally
from learner.policy.registry import PolicyRegistry, PolicyVersion


def test_canary_delivery_and_gate_figures_come_from_redis(redis_client):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    v1 = PolicyVersion("v1", "v0", "tiny", "file:///nowhere/v1", "lora", metrics={"kl": 0.02})
    registry.publish(v1)
    comparison = {
        "n": 10,
        "champion_rate": 0.5,
        "candidate_rate": 0.8,
        "champion_solved": 5,
        "candidate_solved": 8,
        "champion_ci": [0.24, 0.76],
        "candidate_ci": [0.49, 0.94],
    }
    registry.attach_report(
        "v1",
        {
            "verdict": "pass",
            "champion": "v0",
            "failed": [],
            "episodes": {"comparison": comparison},
            "summary": "gate v1: PASS",
        },
    )
    registry.open_candidate("v1", reason="gate passed", actor="test")
    canary = {
        "candidate": "v1",
        "champion": "v0",
        "n_champion": 12,
        "n_candidate": 3,
        "diff": 0.1,
        "ci_low": -0.5,
        "ci_high": 0.7,
        "action": "continue",
    }
    redis_client.set(LEARNER_STATUS, json.dumps({"updated_at": 1.0, "canary": canary}))
    for name, digest in (("a:1", "sha256:aaa"), ("b:2", "sha256:bbb")):  # two servers disagree
        report = {
            "instance": name,
            "serving": {"champion": "v0", "candidate": "v1"},
            "digests": {"v0": "base:tiny", "v1": digest},
            "updated_at": 1.0,
        }
        redis_client.set(serving_key(name), json.dumps(report))
    data = snapshot(redis_client, Tally(), canary_share=0.25)

    assert data["canary"] == {"share": 0.25, **canary, "checked": True}
    delivery = {d["alias"]: d for d in data["delivery"]}
    assert delivery["champion"]["delivered"] and delivery["champion"]["consistent"]
    assert delivery["candidate"]["servers"] == 2 and not delivery["candidate"]["consistent"]
    rows = {r["version"]: r for r in data["versions"]}
    assert rows["v1"]["held_out"]["rate"] == 0.8 and rows["v1"]["held_out"]["low"] == 0.49
    assert rows["v0"]["held_out"]["solved"] == 5 and rows["v0"]["gate"]["verdict"] == "base"
    assert rows["v1"]["aliases"] == ["candidate"] and rows["v1"]["served_by"] == 2
    assert [r["version"] for r in data["rounds"]] == ["v1"] and data["rounds"][0]["kl"] == 0.02
    svg = data["charts"]["held_out"]
    ys = dict(re.findall(r'data-x="(v\d)" data-y="([0-9.]+)"', svg))
    assert ys == {"v0": "0.5", "v1": "0.8"}
    redis_client.delete(serving_key("a:1"), serving_key("b:2"))  # both servers gone
    gone = {d["alias"]: d for d in snapshot(redis_client, Tally(), 0.25)["delivery"]}
    assert gone["candidate"]["servers"] == 0 and not gone["candidate"]["delivered"]


def test_the_canary_is_named_by_the_registry_not_by_a_stale_learner_check(redis_client):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    registry.publish(PolicyVersion("v1", "v0", "tiny", "file:///nowhere/v1", "lora"))
    registry.open_candidate("v1", reason="gate passed", actor="test")
    canary = snapshot(redis_client, Tally(), canary_share=0.1)["canary"]  # no learner status
    assert canary == {"share": 0.1, "candidate": "v1", "champion": "v0", "checked": False}
    stale = {"candidate": "v9", "champion": "v0", "n_candidate": 4, "diff": 0.3}
    redis_client.set(LEARNER_STATUS, json.dumps({"updated_at": 1.0, "canary": stale}))
    canary = snapshot(redis_client, Tally(), canary_share=0.1)["canary"]
    assert canary["candidate"] == "v1" and not canary["checked"] and "diff" not in canary


def test_a_round_of_kto_updates_only_is_charted(redis_client):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    kto = {"kto/loss": 0.69, "kto/kl": 0.004, "updates": 2.0}
    registry.publish(PolicyVersion("v1", "v0", "tiny", "file:///nowhere/v1", "lora", metrics=kto))
    data = snapshot(redis_client, Tally(), canary_share=0.0)
    assert data["rounds"][0]["kto/kl"] == 0.004 and "kl" not in data["rounds"][0]
    for chart, value in (("kl", "0.004"), ("loss", "0.69")):
        svg = data["charts"][chart]
        assert 'data-series="KTO" data-x="v1" data-y="' + value + '"' in svg, chart
        assert "no data yet" not in svg
    assert "no data yet" in data["charts"]["entropy"]  # KTO has no entropy: honestly empty


def test_no_chart_joins_two_versions_with_a_line(redis_client):
    registry = PolicyRegistry(redis_client)
    registry.ensure_base("tiny")
    for n in (1, 2):
        metrics = {"kl": 0.01 * n, "loss": 0.5 / n}
        registry.publish(PolicyVersion(f"v{n}", "v0", "tiny", "file:///n", "lora", metrics=metrics))
    charts = snapshot(redis_client, Tally(), canary_share=0.0)["charts"]
    assert charts["kl"].count('class="point"') == 2
    assert not any("polyline" in svg or "<path" in svg for svg in charts.values())


def test_the_learner_is_running_lagging_stopped_or_never_seen(redis_client):
    def state():
        return snapshot(redis_client, Tally(), canary_share=0.0)["learner_state"]

    assert state()["state"] == "never"
    redis_client.set(
        LEARNER_STATUS, json.dumps({"consumer": "l1", "updated_at": time.time() - 169.6})
    )  # 170 s, whole, while the read takes under 0.9 s
    stopped = state()
    assert stopped["state"] == "stopped" and "last report 170 s ago" in stopped["line"]
    redis_client.set(LEARNER_LEASE, "3|l1@host", px=30_000)
    running = state()
    assert running["state"] == "running" and running["line"].startswith("Learner running: l1@host")
    stats = {"streams": [{"stream": STREAM_FEEDBACK, "lag_seconds": LAGGING_AFTER_S + 5}]}
    lagging = learner_state({"updated_at": time.time()}, "3|l1@host", stats)
    assert lagging["state"] == "lagging" and "65 s old" in lagging["line"]
    stats["streams"][0]["lag_seconds"] = LAGGING_AFTER_S - 5
    assert learner_state({"updated_at": time.time()}, "3|l1@host", stats)["state"] == "running"


def test_a_real_round_on_thumbs_alone_has_its_points_on_the_round_charts(redis_client, tmp_path):
    """Lone answers judged only by thumbs train by KTO: the round's figures are `kto/*`, which
    the five policy-gradient charts alone showed as 'no data yet'."""
    from learner.rounds import run_round
    from learner.trajectory_source import TrajectorySource
    from tests.learner.learner_events import feedback, trajectory, xadd
    from tests.learner.learner_fixtures import base_registry, open_store, tiny_round_plan

    registry, store = base_registry(redis_client), open_store(tmp_path)
    for i in range(4):  # each prompt once: no group to compare with
        t = trajectory(
            f"What is {i} plus 30?",
            "The answer is 42." if i % 2 else "no",
            user=f"u{i}",
            logprobs=True,
        )
        xadd(redis_client, t)
        xadd(redis_client, feedback(t.event_id, "thumbs", 1 if i % 2 else -1, user=f"u{i}"))
    source = TrajectorySource(redis_client, store, "learner-1", block_ms=10)
    source.ensure_groups()
    while not source.poll().caught_up:
        pass
    result = run_round(store, registry, tiny_round_plan(tmp_path, kto_judgements=True))
    store.close()
    assert "kl" not in result.metrics and "kto/loss" in result.metrics  # a KTO-only round
    data = snapshot(redis_client, Tally(), canary_share=0.0)
    charted = {}
    for name, svg in data["charts"].items():
        for series, x, y in re.findall(
            r'data-series="([^"]+)" data-x="(v\d+)" data-y="([^"]+)"', svg
        ):
            charted[(name, series, x)] = float(y)
    assert charted[("loss", "KTO", result.version)] == result.metrics["kto/loss"]
    assert charted[("kl", "KTO", result.version)] == result.metrics["kto/kl"]
    assert "no data yet" not in data["charts"]["loss"]


def test_a_redis_user_that_may_not_read_the_lease_says_so_and_the_dashboard_still_loads(
    redis_client,
):
    class OldAcl:  # the agent API's user under an ACL from before the dashboard read the lease
        def __getattr__(self, name):
            return getattr(redis_client, name)

        def get(self, key):
            if key == LEARNER_LEASE:
                raise redis.exceptions.NoPermissionError("no permissions")
            return redis_client.get(key)

    state = snapshot(OldAcl(), Tally(), canary_share=0.0)["learner_state"]
    assert state["state"] == "unknown" and "redis-acl.conf" in state["line"]
