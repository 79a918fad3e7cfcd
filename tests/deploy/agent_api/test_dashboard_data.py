"""The dashboard's data from Redis alone: canary, delivery to the policy servers, versions."""

from __future__ import annotations

import json
import re

from agents.events import LEARNER_STATUS, serving_key
from deploy.agent_api.dashboard_data import snapshot
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

    assert data["canary"] == {"share": 0.25, **canary}
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
