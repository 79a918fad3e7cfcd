"""The dashboard and the report card in headless Chromium, on the data of a real
`arloop demo --quick` run: the charts' data points are the registry's and the streams' figures."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import replace

import redis

from agents.events import LEARNER_LEASE, STREAM_TRAJECTORIES, decode
from deploy.agent_api.dashboard_data import LAGGING_AFTER_S
from deploy.embedded_redis import start_redis
from learner.policy.lifecycle import VersionStatus
from learner.policy.registry import PolicyRegistry
from tests.fakes.api import API_KEY

POINTS = """name => [...document.querySelectorAll(`figure[data-chart="${name}"] circle.point`)].map(
  c => ({series: c.dataset.series, x: c.dataset.x, y: Number(c.dataset.y), cy: Number(c.getAttribute('cy'))}))"""


def open_page(page, api, path: str) -> None:
    page.goto(f"{api.server.url}{path}")
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")


def points(page, chart: str, series: str | None = None) -> dict[str, float]:
    found = page.evaluate(POINTS, chart)
    return {p["x"]: p["y"] for p in found if series is None or p["series"] == series}


def demo_api(start_api, client):
    where = client.connection_pool.connection_kwargs
    return start_api(redis_url=f"redis://{where['host']}:{where['port']}/0", specs=None)


def test_the_dashboard_charts_a_real_quick_demo(start_api, page, quick_demo, tmp_path):
    _, folder, client, _ = quick_demo
    saved = {r["version"]: r for r in json.loads((folder / "report.json").read_text())["versions"]}
    registry = PolicyRegistry(client)
    api = demo_api(start_api, client)
    open_page(page, api, "/dashboard?refresh=60")
    page.wait_for_selector("body[data-loaded]")
    page.wait_for_selector('figure[data-chart="reward"] circle.point')

    # per round (one published version each): the registry's metrics, by TRL's names
    trained = [v for v in registry.versions() if v.metrics]
    assert [v.version for v in trained] == ["v1"]
    for name in ("reward", "kl", "entropy", "completions/mean_length"):
        expected = {v.version: v.metrics[name] for v in trained if name in v.metrics}
        assert expected, f"the demo's round has no {name}"
        assert points(page, name) == expected, name
    # held-out success per version, with its interval: v1's gate report's whole runs (the
    # demo's report also counts the final check's runs, so its n can be larger)
    held = points(page, "held_out")
    assert set(held) == {"v0", "v1"}
    gate = registry.get("v1").report["episodes"]["comparison"]
    sides = {"v0": "champion", "v1": "candidate"}
    for version, side in sides.items():
        assert math.isclose(held[version], gate[f"{side}_rate"]), version
    bars = page.evaluate(
        """() => [...document.querySelectorAll('figure[data-chart="held_out"] line.interval')]
             .map(l => [Number(l.dataset.low), Number(l.dataset.high)])"""
    )
    assert sorted(bars) == sorted(list(gate[f"{side}_ci"]) for side in sides.values())
    # live traffic: thumbs-up rate per version, as the demo report counted it
    live = points(page, "live", "thumbs-up rate")
    for version, row in saved.items():
        judged = row["thumbs_up"] + row["thumbs_down"]
        if judged:
            assert math.isclose(live[version], row["thumbs_up"] / judged), version
    drawn = page.evaluate(POINTS, "held_out")  # a higher value is drawn higher
    if len({p["y"] for p in drawn}) == 2:
        low, high = sorted(drawn, key=lambda p: p["y"])
        assert low["cy"] > high["cy"]

    # the versions table: gate verdicts from the registry; serving and streams
    for version in ("v0", "v1"):
        row = page.locator(f'#versions tr[data-version="{version}"]')
        verdict = (registry.get(version).report or {}).get("verdict", "base")
        assert row.locator("td").nth(6).inner_text().startswith(verdict)
    runs = [decode(f) for _, f in client.xrange(STREAM_TRAJECTORIES)]
    length = page.locator(f'#streams tr[data-stream="{STREAM_TRAJECTORIES}"] td').nth(1)
    assert int(length.inner_text()) == len(runs)
    champion = page.locator('#delivery tr[data-alias="champion"] td')
    assert champion.nth(1).inner_text() == registry.resolve("champion")
    assert champion.nth(4).inner_text() == "NOT DELIVERED"  # the demo's servers have stopped
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'dashboard.png'}")

    # the report card of the same runs
    open_page(page, api, "/report-card")
    page.wait_for_selector("#card tr[data-agent]")
    served = Counter(t.policy_version for t in runs)
    for version, n in served.items():
        cells = page.locator(f'#card tr[data-agent="tutor"][data-version="{version}"] td')
        assert int(cells.nth(2).inner_text()) == n, version
    page.screenshot(path=str(tmp_path / "report-card.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'report-card.png'}")


def copy_redis(source, directory):
    """A Redis of its own holding every key of `source` (groups and TTLs kept): the shared
    demo data stays as the demo left it."""
    server = start_redis(directory)
    target = redis.Redis.from_url(server.url)
    for key in source.scan_iter(count=500):
        ttl, value = source.pttl(key), source.dump(key)
        if value is None:  # a key whose TTL ran out between the scan and the dump
            continue
        target.restore(key, ttl if ttl > 0 else 0, value, replace=True)
    return server, target


def drawn(page) -> dict:
    """What the dashboard shows, read back from the page."""
    return page.evaluate(
        """() => ({
          canary: document.querySelector('#canary-state')?.textContent ?? null,
          learner: document.querySelector('#learner-state').textContent,
          state: document.querySelector('#learner').dataset.state,
          lines: document.querySelectorAll('figure polyline, figure path.line').length,
          empty: [...document.querySelectorAll('figure[data-chart]')]
            .filter(f => f.querySelector('text.empty')).map(f => f.dataset.chart),
          versions: Object.fromEntries([...document.querySelectorAll('#versions tr[data-version]')]
            .map(r => [r.dataset.version, [...r.cells].map(c => c.firstChild?.textContent ?? '')])),
          streams: Object.fromEntries([...document.querySelectorAll('#streams tr[data-stream]')]
            .map(r => [r.dataset.stream, [...r.cells].map(c => c.textContent)])),
          delivery: Object.fromEntries([...document.querySelectorAll('#delivery tr[data-alias]')]
            .map(r => [r.dataset.alias, [...r.cells].map(c => c.textContent)])),
        })"""
    )


def load(page, api) -> dict:
    """Open the dashboard; the JSON of `GET /v1/dashboard` that the page drew: the answer to
    the call the key's entry starts, the page's newest (the page draws only its newest call's
    answer; the call it makes as it opens, with a key kept from an earlier visit, may answer
    after it, and was seen to in make test)."""
    page.goto(f"{api.server.url}/dashboard?refresh=600")
    page.fill("#api-key", API_KEY)
    with page.expect_response(lambda r: r.url.endswith("/v1/dashboard") and r.ok) as answer:
        page.dispatch_event("#api-key", "change")
    data = answer.value.json()
    page.wait_for_selector(f'body[data-loaded="{data["at"]}"]')
    return data


def pct(page, x) -> str:
    """`x` as the page writes a share (JavaScript's rounding, not Python's)."""
    return page.evaluate("x => arloop.pct(x)", x)


def test_every_figure_on_the_dashboard_is_the_apis_after_a_real_round(
    start_api, page, quick_demo, tmp_path
):
    server, client = copy_redis(quick_demo[2], tmp_path / "redis")
    try:
        registry = PolicyRegistry(client)
        v1 = registry.get("v1")
        # a second round of thumbs only (KTO updates: `kto/*` metrics, no `kl`, `reward`)
        # whose version passed the gate and went out as a canary against the demo's v1
        kto = {"kto/loss": 0.69, "kto/kl": 0.004, "updates": 2.0}
        registry.publish(
            replace(
                v1,
                version="v2",
                parent="v1",
                metrics=kto,
                report=None,
                status=VersionStatus.READY,
                created_at=time.time(),
            )
        )
        registry.open_candidate("v2", reason="gate passed", actor="test")
        api = start_api(redis_url=server.url, specs=None, canary_share=0.1)
        data = load(page, api)
        shown = drawn(page)

        # the canary's arms are the registry's aliases, named with their versions
        assert data["canary"]["candidate"] == "v2" and data["canary"]["champion"] == "v1"
        assert shown["canary"].startswith("Canary: v2 (candidate) vs v1 (champion) on 10% ")
        assert "undefined" not in shown["canary"]
        assert not data["canary"]["checked"]  # the demo's learner never checked this canary
        assert shown["canary"].endswith("not checked yet: no learner is running to decide it")
        # the learner's state, said plainly: the demo's learner has stopped (its lease is gone)
        assert data["learner_state"]["state"] == shown["state"] == "stopped"
        # the page and the API read the clock at different moments: "report 118 s ago" and
        # "119 s ago" are the same line (a flake seen once in make test)
        ages = lambda line: re.sub(r"\d+ s ago", "N s ago", line)  # noqa: E731
        assert ages(shown["learner"]) == ages(data["learner_state"]["line"])
        assert shown["learner"].startswith("Learner stopped")
        # every chart: the API's points, and no line joins two versions
        assert shown["lines"] == 0
        for name in ("reward", "kl", "entropy", "clip_ratio", "completions/mean_length", "loss"):
            on_page = page.evaluate(POINTS, name)
            expected = {
                (kind, r["version"], r[prefix + name])
                for r in data["rounds"]
                for kind, prefix in (("policy gradient", ""), ("KTO", "kto/"), ("DPO", "dpo/"))
                if prefix + name in r
            }
            assert {(p["series"], p["x"], p["y"]) for p in on_page} == expected, name
            for r in data["rounds"]:  # the API's rounds are the registry's metrics
                metrics = registry.get(r["version"]).metrics
                assert all(r[k] == metrics[k] for k in r if k in metrics)
        assert {p["x"] for p in page.evaluate(POINTS, "kl")} == {"v1", "v2"}  # v2: KTO's kl
        assert {p["x"] for p in page.evaluate(POINTS, "loss")} == {"v1", "v2"}
        assert shown["empty"] == []  # every round chart has the rounds' points
        held = {(p["x"], p["y"]) for p in page.evaluate(POINTS, "held_out")}
        assert held == {
            (r["version"], r["held_out"]["rate"]) for r in data["versions"] if r["held_out"]
        }
        live = {(p["series"], p["x"], p["y"]) for p in page.evaluate(POINTS, "live")}
        assert live == {
            (series, r["version"], r["traffic"][key])
            for r in data["versions"]
            if r["traffic"]
            for series, key in (
                ("thumbs-up rate", "thumbs_up_rate"),
                ("feedback rate", "feedback_rate"),
            )
            if r["traffic"].get(key) is not None
        }
        # the tables: versions, delivery, streams
        for r in data["versions"]:
            cells = shown["versions"][r["version"]]
            assert cells[1] == r["status"] and cells[2] == ", ".join(r["aliases"])
            held = r["held_out"]
            assert cells[3].startswith(pct(page, held["rate"]) if held else "–")
            if held:
                assert f"({held['solved']}/{held['n']})" in cells[3]
                assert f"[{pct(page, held['low'])}, {pct(page, held['high'])}]" in cells[3]
            t = r["traffic"] or {}
            assert cells[4].startswith(pct(page, t.get("thumbs_up_rate")))
            if "thumbs_up" in t:
                assert cells[4].endswith(f"({t['thumbs_up']}/{t['thumbs_up'] + t['thumbs_down']})")
            assert cells[5] == f"{pct(page, t.get('feedback_rate'))} ({t.get('runs', 0)})"
            assert cells[6].startswith(r["gate"]["verdict"] or "–")
            assert cells[7] == str(r["served_by"])
        learner = data["learner"]  # the learner's own report: its last round and release
        lines = page.locator("#learner p").all_inner_texts()
        assert lines[1].startswith(f"last round: {learner['last_round']['version']} in ")
        assert f"release: {learner['release']}" in lines
        for d in data["delivery"]:
            assert shown["delivery"][d["alias"]][:3] == [
                d["alias"],
                d["version"],
                f"{d['servers']} of {d['of']}",
            ]
        for s in data["streams"]["streams"]:
            cells = shown["streams"][s["stream"]]
            assert [cells[1], cells[4]] == [str(s["length"]), str(s["pending"])]
            assert cells[2] == f"{s['lag']}{'+' if s.get('lag_capped') else ''}"
        assert shown["streams"]["dead"][1] == str(data["streams"]["dead_letters"])

        # a learner that holds the lease is running (or lagging, by the streams' oldest unread)
        client.set(LEARNER_LEASE, "9|learner-1@test", px=30_000)
        data = load(page, api)
        shown = drawn(page)
        oldest = max(s["lag_seconds"] for s in data["streams"]["streams"])
        assert (
            shown["state"]
            == data["learner_state"]["state"]
            == ("lagging" if oldest > LAGGING_AFTER_S else "running")
        )
        # the page and the API read the clock at different moments: "report 118 s ago" and
        # "119 s ago" are the same line (a flake seen once in make test)
        ages = lambda line: re.sub(r"\d+ s ago", "N s ago", line)  # noqa: E731
        assert ages(shown["learner"]) == ages(data["learner_state"]["line"])
        assert "learner-1@test" in shown["learner"]
        assert shown["canary"].endswith("not checked yet: waiting for the learner's check")
        page.screenshot(path=str(tmp_path / "dashboard-canary.png"), full_page=True)
        print(f"screenshot: {tmp_path / 'dashboard-canary.png'}")
    finally:
        client.close()
        server.stop()


COUNT_JSON = """(() => {
  window.__jsonDone = 0;
  const json = Response.prototype.json;
  Response.prototype.json = function () {
    return json.call(this).finally(() => { window.__jsonDone += 1; });
  };
})();"""
"""Counts the JSON bodies the page has read (an init script, run before the page's own)."""


def test_an_older_answer_arriving_last_is_not_drawn_over_the_newest(start_api, page):
    """The call the page makes as it opens is held until the key's call has been drawn; then
    it answers with an older `at`: the page keeps the newest data (the race make test saw)."""
    api = start_api()
    held = []

    def hold_the_first(route):
        if not held:
            held.append(route)
        else:
            route.continue_()

    page.add_init_script(COUNT_JSON)
    page.route("**/v1/dashboard", hold_the_first)
    newest = load(page, api)  # drawn: the key's call's answer
    assert len(held) == 1  # the opening call, still unanswered

    stale = newest | {"at": newest["at"] - 100}
    held[0].fulfill(status=200, content_type="application/json", body=json.dumps(stale))
    page.wait_for_function("() => window.__jsonDone >= 2")  # the stale answer was read
    page.evaluate("() => new Promise(r => setTimeout(r, 0))")  # and its handler has run
    assert page.evaluate("() => document.body.dataset.loaded") == str(newest["at"])
    assert "error" not in page.get_attribute("#status", "class")
