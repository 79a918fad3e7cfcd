"""The dashboard and the report card in headless Chromium, on the data of a real
`arloop demo --quick` run: the charts' data points are the registry's and the streams' figures."""

from __future__ import annotations

import json
import math
from collections import Counter

from agents.events import STREAM_TRAJECTORIES, decode
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
